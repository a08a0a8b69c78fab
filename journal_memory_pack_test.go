package idem

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
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
	assert.Nil(t, packHeader(nil).header())
	assert.Nil(t, packHeader(http.Header{}).header())
}
