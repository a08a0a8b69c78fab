package wire_test

// Fuzz targets for the wire conventions. Each checks properties that a
// wrong implementation violates, not only the absence of panics. The seeds
// (f.Add below and testdata/fuzz/<target>/) run as ordinary tests with
// `go test`; `go test -run '^$' -fuzz '^FuzzParseKey$' ./internal/wire`
// fuzzes one target.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemkit/idem/internal/wire"
)

// fzTokenChars are the tchar punctuation of RFC 9110, written out here
// rather than taken from the package under test.
const fzTokenChars = "!#$%&'*+-.^_`|~"

// fzIsToken reports whether s is a non-empty RFC 9110 token.
func fzIsToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(fzTokenChars, c) >= 0) {
			return false
		}
	}
	return true
}

// fzIsPrintable reports whether s is printable ASCII (0x20-0x7e), the
// characters an RFC 8941 sf-string may hold.
func fzIsPrintable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		"", " ", "\t \t", `""`, `" "`,
		"3f1c9a4e-6d2b-4e8f-9a7c-1b2d3e4f5a6b",   // bare UUID
		`"3f1c9a4e-6d2b-4e8f-9a7c-1b2d3e4f5a6b"`, // the same, as an sf-string
		"  key-1\t", `  "key-1"  `,               // surrounding whitespace
		"!#$%&'*+-.^_`|~", "a b", "a,b", "a;b", "é", "k\x00", // token edge cases
		`"a b"`, `"a\"b"`, `"a\\b"`, `"\"\\\""`, `"a\b"`, `"a\`, `"a`, `"a"b`, `"a""`, `"\"`, // sf-string escapes
		`"tab	in"`, "\"\x7f\"", "\"caf\xc3\xa9\"", `"` + strings.Repeat("x", 300) + `"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := wire.ParseKey(v)
		if err != nil {
			if !errors.Is(err, wire.ErrKeyMissing) && !errors.Is(err, wire.ErrKeyInvalid) {
				t.Fatalf("ParseKey(%q) = error %v, which is neither ErrKeyMissing nor ErrKeyInvalid", v, err)
			}
			if k != "" {
				t.Fatalf("ParseKey(%q) = %q with error %v", v, k, err)
			}
			return
		}
		if k == "" {
			t.Fatalf("ParseKey(%q) = empty key without an error", v)
		}
		if !fzIsPrintable(k) {
			t.Fatalf("ParseKey(%q) = %q: a key must be printable ASCII", v, k)
		}
		// A bare value is the key itself, once its whitespace is trimmed.
		if trimmed := strings.Trim(v, " \t"); trimmed[0] != '"' && k != trimmed {
			t.Fatalf("ParseKey(%q) = %q, want the bare token %q", v, k, trimmed)
		}
		q := wire.FormatKey(k, true)
		if back, err := wire.ParseKey(q); err != nil || back != k {
			t.Fatalf("ParseKey(%q) = %q; its quoted form %q parses as %q, %v", v, k, q, back, err)
		}
		if fzIsToken(k) {
			if back, err := wire.ParseKey(wire.FormatKey(k, false)); err != nil || back != k {
				t.Fatalf("ParseKey(%q) = %q; its bare form parses as %q, %v", v, k, back, err)
			}
		}
	})
}

func FuzzFormatKey(f *testing.F) {
	for _, s := range []string{
		"3f1c9a4e-6d2b-4e8f-9a7c-1b2d3e4f5a6b", "a", " ", " a ", `"`, `\`, `\"`, `"\"\\"`, `a"b\c`,
		"!#$%&'*+-.^_`|~", "a,b;c=d", "~", strings.Repeat(`\"`, 40),
		"tab\tkey", "nul\x00", "caf\xc3\xa9", "\xff",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		// Any byte string is a key to check: non-printable bytes are folded
		// into printable ASCII so that no input is wasted.
		key := raw
		if !fzIsPrintable(key) {
			b := []byte(key)
			for i, c := range b {
				if c < 0x20 || c > 0x7e {
					b[i] = 0x20 + c%95
				}
			}
			key = string(b)
		}
		if key == "" {
			return
		}
		q := wire.FormatKey(key, true)
		if len(q) < len(key)+2 || q[0] != '"' || q[len(q)-1] != '"' {
			t.Fatalf("FormatKey(%q, true) = %q: not a quoted sf-string", key, q)
		}
		if back, err := wire.ParseKey(q); err != nil || back != key {
			t.Fatalf("FormatKey(%q, true) = %q parses as %q, %v", key, q, back, err)
		}
		if fzIsToken(key) {
			if bare := wire.FormatKey(key, false); bare != key {
				t.Fatalf("FormatKey(%q, false) = %q, want the token itself", key, bare)
			}
			if back, err := wire.ParseKey(wire.FormatKey(key, false)); err != nil || back != key {
				t.Fatalf("the bare form of %q parses as %q, %v", key, back, err)
			}
		}
		// Whatever the key, its quoted form never parses as another key: it
		// parses back or it is refused.
		if rq := wire.FormatKey(raw, true); raw != "" {
			if back, err := wire.ParseKey(rq); err == nil && back != raw {
				t.Fatalf("FormatKey(%q, true) = %q parses as another key, %q", raw, rq, back)
			}
		}
	})
}

// fzStatusOracle is an independent reading of a status answer, used to
// check DecodeStatus.
type fzStatusOracle struct {
	Key      string `json:"key"`
	State    string `json:"state"`
	Response *struct {
		Status       int    `json:"status"`
		Body         string `json:"body"`
		BodyEncoding string `json:"body_encoding"`
	} `json:"response"`
}

func FuzzDecodeStatus(f *testing.F) {
	const key = "3f1c9a4e-6d2b-4e8f-9a7c-1b2d3e4f5a6b"
	for _, s := range []struct {
		code int
		body string
		key  string
	}{
		{200, `{"key":"` + key + `","state":"processing"}`, key},
		{200, `{"key":"` + key + `","state":"completed","response":{"status":201,"header":{"Content-Type":["application/json"]},"body":"{\"id\":7}"}}`, key},
		{200, `{"key":"` + key + `","state":"completed","response":{"status":200,"body":"AP8=","body_encoding":"base64"}}`, key},
		{200, `{"state":"completed","response":{"status":204,"body":""}}`, key},
		{404, `{"key":"` + key + `","state":"not_found"}`, key},
		{200, `{"key":"` + key + `","state":"not_found"}`, key},                                             // not_found needs 404
		{404, `{"key":"` + key + `","state":"processing"}`, key},                                            // processing needs 200
		{200, `{"key":"other","state":"processing"}`, key},                                                  // another key
		{200, `{"state":"completed"}`, key},                                                                 // no response
		{200, `{"state":"completed","response":{"status":600,"body":""}}`, key},                             // bad status
		{200, `{"state":"completed","response":{"status":200,"body":"%%%","body_encoding":"base64"}}`, key}, // bad base64
		{200, `{"state":"completed","response":{"status":200,"body":"x","body_encoding":"gzip"}}`, key},
		{200, `{"STATE":"Processing"}`, key},
		{500, `{"state":"processing"}`, key},
		{404, `<html>Not Found</html>`, key},
		{404, ``, key},
		{200, `null`, key},
		{200, `{"state":"processing"} trailing`, key},
		{200, `{"state":"completed","response":{"status":200,"body":"\u00e9\ud800"}}`, ""},
	} {
		f.Add(s.code, []byte(s.body), s.key)
	}
	f.Fuzz(func(t *testing.T, code int, body []byte, key string) {
		st, got, err := wire.DecodeStatus(code, body, key)
		if err != nil {
			if !errors.Is(err, wire.ErrBadStatus) {
				t.Fatalf("DecodeStatus(%d, %q, %q): error %v does not wrap ErrBadStatus", code, body, key, err)
			}
			if !reflect.DeepEqual(st, wire.Status{}) || got != nil {
				t.Fatalf("DecodeStatus(%d, %q, %q) returned %+v, %q with error %v", code, body, key, st, got, err)
			}
			return
		}
		if st.Key != "" && st.Key != key {
			t.Fatalf("DecodeStatus(%d, %q, %q) accepted an answer about key %q", code, body, key, st.Key)
		}
		var o fzStatusOracle
		if err := json.Unmarshal(body, &o); err != nil {
			t.Fatalf("DecodeStatus(%d, %q, %q) accepted a body that does not parse: %v", code, body, key, err)
		}
		switch st.State {
		case wire.StateProcessing, wire.StateNotFound:
			want := http.StatusOK
			if st.State == wire.StateNotFound {
				want = http.StatusNotFound
			}
			if code != want {
				t.Fatalf("DecodeStatus(%d, %q): state %s with HTTP %d, want HTTP %d", code, body, st.State, code, want)
			}
			if got != nil {
				t.Fatalf("DecodeStatus(%d, %q): state %s with a body %q", code, body, st.State, got)
			}
		case wire.StateCompleted:
			if code != http.StatusOK {
				t.Fatalf("DecodeStatus(%d, %q): completed with HTTP %d", code, body, code)
			}
			if st.Response == nil || st.Response.Status < 100 || st.Response.Status > 599 {
				t.Fatalf("DecodeStatus(%d, %q): completed with response %+v", code, body, st.Response)
			}
			if o.Response == nil {
				t.Fatalf("DecodeStatus(%d, %q): completed, but the body has no response", code, body)
			}
			want := []byte(o.Response.Body)
			switch o.Response.BodyEncoding {
			case "":
			case "base64":
				if want, err = base64.StdEncoding.DecodeString(o.Response.Body); err != nil {
					t.Fatalf("DecodeStatus(%d, %q): accepted a body that is not base64: %v", code, body, err)
				}
			default:
				t.Fatalf("DecodeStatus(%d, %q): accepted body_encoding %q", code, body, o.Response.BodyEncoding)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("DecodeStatus(%d, %q): body %q, want %q", code, body, got, want)
			}
		default:
			t.Fatalf("DecodeStatus(%d, %q, %q) accepted state %q", code, body, key, st.State)
		}
		if st.State != o.State || st.Key != o.Key {
			t.Fatalf("DecodeStatus(%d, %q): read %q/%q, the body says %q/%q", code, body, st.Key, st.State, o.Key, o.State)
		}
	})
}

// FuzzDecodeStatusRoundTrip checks that what the server side encodes (a
// completed Status made with NewResponse, marshaled to JSON) the client side
// decodes to the same status, header and body bytes.
func FuzzDecodeStatusRoundTrip(f *testing.F) {
	f.Add(201, "Content-Type: application/json\nLocation: /orders/7", []byte(`{"id":7}`), "3f1c9a4e-6d2b-4e8f-9a7c-1b2d3e4f5a6b")
	f.Add(200, "", []byte{}, "k")
	f.Add(204, "", []byte(nil), "")
	f.Add(200, "Content-Type: application/octet-stream", []byte{0x00, 0xff, 0xfe, 0x80}, "k")
	f.Add(500, "Content-Type: text/html", []byte("<b>&amp; \u2028 caf\xc3\xa9</b>"), `k"\`)
	f.Add(422, "Content-Type: application/problem+json", []byte(`{"type":"urn:idem:problem:key-reused"}`), "k")
	f.Add(599, "X-Bin: \xff\xfe", []byte("half \xe2\x82 rune"), "k")
	f.Add(100, "A: 1\nA: 2\nb: 3", []byte("\r\n\t\x00"), "k")
	f.Fuzz(func(t *testing.T, code int, header string, body []byte, key string) {
		if code < 0 {
			code = -(code + 1)
		}
		code = 100 + code%500
		// Keys are printable ASCII on the wire (ParseKey refuses anything
		// else); keep any other key valid UTF-8 so that JSON carries it.
		key = strings.ToValidUTF8(key, "?")
		h := http.Header{}
		for line := range strings.SplitSeq(header, "\n") {
			name, value, ok := strings.Cut(line, ":")
			if name = strings.TrimSpace(name); ok && name != "" {
				h.Add(name, strings.TrimSpace(value))
			}
		}
		in := wire.Status{Key: key, State: wire.StateCompleted, Response: wire.NewResponse(code, h, body)}
		if enc := in.Response.BodyEncoding; enc != "" && enc != "base64" || (enc == "base64") == utf8.Valid(body) {
			t.Fatalf("NewResponse(%q) chose body_encoding %q", body, enc)
		}
		data, err := json.Marshal(in)
		if err != nil {
			t.Fatalf("marshaling %+v: %v", in, err)
		}
		st, got, err := wire.DecodeStatus(http.StatusOK, data, key)
		if err != nil {
			t.Fatalf("DecodeStatus of %s: %v", data, err)
		}
		if st.State != wire.StateCompleted || st.Key != key || st.Response == nil || st.Response.Status != code {
			t.Fatalf("DecodeStatus of %s = %+v, want completed %d for key %q", data, st, code, key)
		}
		if !bytes.Equal(got, body) {
			t.Fatalf("DecodeStatus of %s: body %q, want %q", data, got, body)
		}
		// JSON carries header strings that are valid UTF-8 exactly.
		validHeader := true
		for name, vs := range h {
			validHeader = validHeader && utf8.ValidString(name)
			for _, v := range vs {
				validHeader = validHeader && utf8.ValidString(v)
			}
		}
		if validHeader && len(h) > 0 && !reflect.DeepEqual(st.Response.Header, h) {
			t.Fatalf("DecodeStatus of %s: header %v, want %v", data, st.Response.Header, h)
		}
	})
}

// fzHasProblemPrefix is an independent check of the content type: its first
// bytes, after leading whitespace, are application/problem+json in any ASCII
// case.
func fzHasProblemPrefix(ct string) bool {
	const p = "application/problem+json"
	ct = strings.TrimSpace(ct)
	if len(ct) < len(p) {
		return false
	}
	for i := 0; i < len(p); i++ {
		c := ct[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != p[i] {
			return false
		}
	}
	return true
}

func FuzzParseProblem(f *testing.F) {
	reused := `{"type":"urn:idem:problem:key-reused","title":"Idempotency key reused","status":422,"detail":"another request","key":"k"}`
	for _, s := range []struct{ ct, body string }{
		{"application/problem+json", reused},
		{"Application/Problem+JSON; charset=utf-8", `{"type":"urn:idem:problem:in-progress","status":409}`},
		{"  application/problem+json  ", `{"type":"about:blank"}`},
		{"application/problem+json", `{}`},
		{"application/problem+json", `null`},
		{"application/problem+json", `[]`},
		{"application/problem+json", `{"status":"422"}`},
		{"application/problem+json", `{"status":1e100}`},
		{"application/problem+json", ``},
		{"application/problem+json", `{"type":"urn:idem:problem:key-reused"} {}`},
		{"application/problem+jsonx", `{}`},
		{"application/json", reused},
		{"text/html", `<html></html>`},
		{"", reused},
		{"application/problem", reused},
		{"application/problem+xml", `<problem/>`},
	} {
		f.Add(s.ct, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, ct string, body []byte) {
		p, ok := wire.ParseProblem(ct, body)
		if !ok {
			if p != (wire.Problem{}) {
				t.Fatalf("ParseProblem(%q, %q) = %+v, false", ct, body, p)
			}
			return
		}
		if !fzHasProblemPrefix(ct) {
			t.Fatalf("ParseProblem(%q, %q) accepted a content type that is not application/problem+json", ct, body)
		}
		if !json.Valid(body) {
			t.Fatalf("ParseProblem(%q, %q) accepted a body that is not JSON", ct, body)
		}
		// What was read is stable: marshaled again, it reads the same.
		data, err := json.Marshal(p)
		if err != nil {
			t.Fatalf("marshaling %+v: %v", p, err)
		}
		if back, ok := wire.ParseProblem(ct, data); !ok || back != p {
			t.Fatalf("ParseProblem(%q, %q) = %+v; marshaled as %s it reads %+v, %v", ct, body, p, data, back, ok)
		}
	})
}
