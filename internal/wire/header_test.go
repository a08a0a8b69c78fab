package wire_test

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/wire"
)

// headerPieces are what header names and values are made of in the tests:
// the characters encoding/json escapes, and the ones it leaves alone.
var headerPieces = []string{"a", "Content-Type", "application/json", " ", "\"", "\\", "/", "<", ">", "&",
	"\b", "\f", "\n", "\r", "\t", "\x00", "\x1f", "\x7f", "é", "日本", "\u2028", "\u2029", "😀",
	"\xff", "\xc3", "\xed\xa0\x80", "ü\x80", "'", "=", ",", ":", "{", "}", "[", "]"}

func randomHeader(r *rand.Rand) http.Header {
	piece := func() string {
		s := ""
		for range r.IntN(5) {
			s += headerPieces[r.IntN(len(headerPieces))]
		}
		return s
	}
	h := http.Header{}
	for range 1 + r.IntN(4) {
		var values []string
		switch r.IntN(6) {
		case 0: // nil: json.Marshal writes null
		case 1:
			values = []string{}
		default:
			for range 1 + r.IntN(3) {
				values = append(values, piece())
			}
		}
		h[piece()] = values
	}
	return h
}

// EncodeHeader writes what json.Marshal writes, so that a header set the
// journal stored before finds itself again; a header JSON cannot hold (a
// name or value that is not UTF-8) reads back byte for byte.
func TestEncodeHeaderWritesWhatJSONMarshalWrites(t *testing.T) {
	assert.Nil(t, wire.EncodeHeader(nil))
	assert.Nil(t, wire.EncodeHeader(http.Header{}))
	r := rand.New(rand.NewPCG(1, 2))
	binary := 0
	for i := range 20000 {
		h := randomHeader(r)
		got := wire.EncodeHeader(h)
		if !validUTF8(h) {
			binary++
			back, err := wire.DecodeHeader(got)
			require.NoError(t, err)
			require.Equal(t, h, back, "header %d: %q", i, h)
			require.Equal(t, string(got), string(wire.EncodeHeader(back)), "header %d: one encoding per header", i)
			continue
		}
		want, err := json.Marshal(h)
		require.NoError(t, err)
		require.Equal(t, string(want), string(got), "header %d: %q", i, h)

		back, err := wire.DecodeHeader(got)
		require.NoError(t, err)
		var viaJSON http.Header
		require.NoError(t, json.Unmarshal(got, &viaJSON))
		require.Equal(t, viaJSON, back, "header %d: %q", i, h)
	}
	require.NotZero(t, binary, "the random headers include some that are not UTF-8")
}

func validUTF8(h http.Header) bool {
	for name, values := range h {
		if !utf8.ValidString(name) {
			return false
		}
		for _, v := range values {
			if !utf8.ValidString(v) {
				return false
			}
		}
	}
	return true
}

// A response header that is not UTF-8 (obs-text, as HTTP allows) reads
// back byte for byte, and one that an older version kept as JSON, its
// bytes already turned into U+FFFD, reads as it did.
func TestDecodeHeaderKeepsBytesThatAreNotUTF8(t *testing.T) {
	h := http.Header{"Content-Disposition": {"attachment; filename=\"caf\xe9.txt\""}, "X-Nul": {"a\x00b"}, "X-Nil": nil, "X-None": {}}
	enc := wire.EncodeHeader(h)
	assert.False(t, json.Valid(enc), "not the JSON form, which would turn 0xE9 into U+FFFD")
	back, err := wire.DecodeHeader(enc)
	require.NoError(t, err)
	assert.Equal(t, h, back)
	assert.Equal(t, []byte("attachment; filename=\"caf\xe9.txt\""), []byte(back.Get("Content-Disposition")))

	old := []byte(`{"Content-Disposition":["attachment; filename=\"caf\ufffd.txt\""]}`) // json.Marshal's, as stored before
	back, err = wire.DecodeHeader(old)
	require.NoError(t, err)
	assert.Equal(t, http.Header{"Content-Disposition": {"attachment; filename=\"caf\uFFFD.txt\""}}, back)

	for _, cut := range [][]byte{enc[:len(enc)-1], enc[:2], append(enc[:len(enc):len(enc)], 'x'), {0x01, 0x05, 'A'}, {0x01, 0x01, 'A', 0xff, 0xff, 0xff, 0xff, 0x0f}} {
		_, err := wire.DecodeHeader(cut)
		assert.Error(t, err, "damaged: %q", cut)
	}
}

// DecodeHeader reads any JSON header as json.Unmarshal does, what it
// reads itself and what it hands to json.Unmarshal alike.
func TestDecodeHeaderReadsAsJSONUnmarshal(t *testing.T) {
	for _, in := range []string{
		`{}`, `null`, `{"A":null}`, `{"A":[]}`, `{"A":["x","y"],"B":["z"]}`,
		` {"A":["x"]}`, `{"A": ["x"]}`, `{"A":["\u00e9\ud83d\ude00\/"]}`, `{"A":["\ud800"]}`,
		`{"A":["x"],"A":["y"]}`, `{"A":["x",]}`, `{"A":"x"}`, `{"A":[1]}`, `{"A":["x"]}x`, `{"A":["x"]`,
		"{\"A\":[\"\xff\"]}", "{\"A\":[\"\x01\"]}", `{"A":["\q"]}`, `[]`, `"A"`,
	} {
		want, wantErr := decodeViaJSON([]byte(in))
		got, err := wire.DecodeHeader([]byte(in))
		if wantErr != nil {
			assert.Error(t, err, "%s", in)
			continue
		}
		if assert.NoError(t, err, "%s", in) {
			assert.Equal(t, want, got, "%s", in)
		}
	}
}

// The values DecodeHeader returns share one array; adding to one name's
// must not change the next's.
func TestDecodeHeaderValuesAreApart(t *testing.T) {
	h, err := wire.DecodeHeader([]byte(`{"A":["a1","a2"],"B":["b1"],"C":[],"D":null}`))
	require.NoError(t, err)
	h.Add("A", "a3")
	h["C"] = append(h["C"], "c1")
	assert.Equal(t, http.Header{"A": {"a1", "a2", "a3"}, "B": {"b1"}, "C": {"c1"}, "D": nil}, h)
}

func decodeViaJSON(b []byte) (http.Header, error) {
	var h http.Header
	err := json.Unmarshal(b, &h)
	return h, err
}

func FuzzDecodeHeader(f *testing.F) {
	for _, s := range []string{`{"A":["x","y"],"B":null,"C":[]}`, `{"\u003c":["\ufffd\n"]}`, `{"A": ["x"]}`, `{}`} {
		f.Add([]byte(s))
	}
	f.Add([]byte{0x01, 0x01, 'A', 0x02, 0x01, 0xe9})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 {
			return
		}
		if b[0] == 0x01 { // the binary form: what it reads, it writes back and reads again alike
			got, err := wire.DecodeHeader(b)
			if err != nil || len(got) == 0 {
				return
			}
			back, err := wire.DecodeHeader(wire.EncodeHeader(got))
			if err != nil || !assert.ObjectsAreEqual(got, back) {
				t.Fatalf("DecodeHeader(%q) = %q, which reads back as %q (%v)", b, got, back, err)
			}
			return
		}
		want, wantErr := decodeViaJSON(b)
		got, err := wire.DecodeHeader(b)
		if wantErr != nil {
			if err == nil {
				t.Fatalf("DecodeHeader(%q) = %q, json.Unmarshal fails: %v", b, got, wantErr)
			}
			return
		}
		if err != nil {
			t.Fatalf("DecodeHeader(%q): %v, json.Unmarshal reads %q", b, err, want)
		}
		if !assert.ObjectsAreEqual(want, got) {
			t.Fatalf("DecodeHeader(%q) = %q, json.Unmarshal reads %q", b, got, want)
		}
		// What EncodeHeader writes of it is json.Marshal's, and reads back.
		if enc, want := wire.EncodeHeader(got), mustMarshal(t, got); len(got) > 0 && string(enc) != string(want) {
			t.Fatalf("EncodeHeader(%q) = %s, json.Marshal writes %s", got, enc, want)
		}
	})
}

func mustMarshal(t *testing.T, h http.Header) []byte {
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// BenchmarkEncodeHeader: a response's header as the journal keeps it,
// through EncodeHeader and through json.Marshal, and back.
func BenchmarkEncodeHeader(b *testing.B) {
	h := http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/ord_1"},
		"Date": {"Tue, 01 Dec 2026 12:00:00 GMT"}, "Idempotency-Replayed": {"false"}}
	enc := wire.EncodeHeader(h)
	b.Run("EncodeHeader", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			wire.EncodeHeader(h)
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = json.Marshal(h)
		}
	})
	b.Run("DecodeHeader", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = wire.DecodeHeader(enc)
		}
	})
	b.Run("json.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = decodeViaJSON(enc)
		}
	})
}
