package idem

import (
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A MemoryJournal keeps a response's header packed (packedHeader): it
// must read back as it was given, a nil value list and an empty one
// told apart, lengths past one varint byte included.
func TestPackedHeaderReadsBackAsGiven(t *testing.T) {
	long := strings.Repeat("v", 300)
	for _, h := range []http.Header{
		{"Content-Type": {"application/json"}},
		{"Link": {"</a>; rel=next", "</b>; rel=prev"}, "X-Empty": {""}, "X-Nil": nil, "X-None": {}},
		{strings.Repeat("K", 200): {long, "", long}, "é": {"ü"}},
	} {
		got := packHeader(h).header()
		assert.Equal(t, h, got)
		size, _ := packedHeaderSize(h)
		assert.Len(t, packHeader(h), size, "packedHeaderSize is the length packed, exactly")
		for k, vs := range h {
			assert.Equal(t, vs == nil, got[k] == nil, "%s: nil stays nil, empty stays empty", k)
		}
		if vs := got["Link"]; len(vs) > 0 {
			// Each name's values are a slice of their own: appending to
			// one does not overwrite the next.
			got["Link"] = append(vs, "x")
			for k := range h {
				if k != "Link" {
					assert.Equal(t, h[k], got[k], k)
				}
			}
		}
	}
	for _, h := range []http.Header{nil, {}, {"A": {strings.Repeat("v", 1<<14)}}} {
		size, _ := packedHeaderSize(h)
		assert.Len(t, packHeader(h), size, "packedHeaderSize is the length packed, exactly")
	}
	assert.Nil(t, packHeader(nil).header())
	assert.Nil(t, packHeader(http.Header{}).header())
}

// A settled record is kept packed (packRecord): every field of it, of its
// Response, its Lease and its history's events must read back as it was,
// a field added to one of them later included (each is set here, by
// reflection, to a value of its own).
func TestPackedRecordReadsBackAsGiven(t *testing.T) {
	n := 0
	var fill func(v reflect.Value)
	fill = func(v reflect.Value) {
		n++
		switch v.Kind() {
		case reflect.String:
			v.SetString(strings.Repeat(fmt.Sprint("s", n), n%7+1))
		case reflect.Bool:
			v.SetBool(true)
		case reflect.Int, reflect.Int64:
			v.SetInt(int64(n) * 1000003)
		case reflect.Uint8:
			v.SetUint(uint64(n % 5))
		case reflect.Pointer:
			v.Set(reflect.New(v.Type().Elem()))
			fill(v.Elem())
		case reflect.Struct:
			if v.Type() == reflect.TypeOf(time.Time{}) {
				v.Set(reflect.ValueOf(time.UnixMilli(int64(n) * 987654321)))
				return
			}
			for i := range v.NumField() {
				fill(v.Field(i))
			}
		case reflect.Slice:
			if v.Type().Elem().Kind() == reflect.Uint8 {
				v.SetBytes([]byte(fmt.Sprint("body", n)))
			}
		case reflect.Map:
			v.Set(reflect.ValueOf(http.Header{"X-Field": {fmt.Sprint(n)}}))
		default:
			t.Fatalf("%s: a field of a kind the test does not fill", v.Type())
		}
	}
	var rec Record
	fill(reflect.ValueOf(&rec).Elem())
	history := make([]Event, 3)
	for i := range history {
		fill(reflect.ValueOf(&history[i]).Elem())
	}
	history[2].At = time.UnixMilli(5).UTC()
	stored := rec
	stored.Header = nil
	resp := *rec.Response
	resp.Header = nil
	stored.Response = &resp
	// The headers packed already, or a writer's maps packed straight
	// into the record, and a new answer's body with them (wrote).
	for _, c := range []struct {
		name         string
		header, resp memHeader
		respBody     []byte
	}{
		{"packed", packedAs(packHeader(rec.Header)), packedAs(packHeader(rec.Response.Header)), nil},
		{"maps", memHeader{m: rec.Header}, memHeader{m: rec.Response.Header}, rec.Response.Body},
	} {
		p, body, ok := packRecord(stored, c.header, c.resp, c.respBody, history)
		require.True(t, ok, c.name)
		respBody := rec.Response.Body
		if c.respBody != nil {
			assert.Equal(t, rec.Response.Body, body, c.name)
			assert.Equal(t, len(body), cap(body), "%s: the body packed is a slice no append writes past", c.name)
			respBody = body
		}
		got, header, respHeader, gotHistory := unpackRecord(p, rec.Body, respBody, true)
		got.Header = header.header()
		got.Response.Header = respHeader.header()
		assert.Equal(t, rec, got, c.name)
		assert.Equal(t, history, gotHistory, c.name)
		assert.True(t, gotHistory[2].At == history[2].At, "%s: a UTC time stays UTC", c.name)
	}

	// A time that would not read back as it is (another location, a
	// monotonic reading) keeps the record unpacked; one that would, in
	// Local or UTC, packs.
	for _, c := range []struct {
		name string
		at   time.Time
		ok   bool
	}{
		{"another location", time.UnixMilli(5).In(time.FixedZone("X", 3600)), false},
		{"a monotonic reading", time.Now(), false},
		{"UTC", time.UnixMilli(5).UTC(), true},
		{"Local", time.UnixMilli(5), true},
		{"Local, from a monotonic reading", time.Now().Round(0), true},
	} {
		stored.NextAttemptAt = c.at
		p, _, ok := packRecord(stored, memHeader{}, memHeader{}, nil, nil)
		assert.Equal(t, c.ok, ok, c.name)
		if got, _, _, _ := unpackRecord(p, nil, nil, false); ok {
			assert.True(t, got.NextAttemptAt == c.at, "%s: reads back as it was", c.name)
		}
	}
}
