package idem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A header net/http's transport refuses to write (a value with CR, LF or
// NUL, a name that is not a token) would be journaled as an operation that
// can never be sent, pending for ever: it is refused before, through the
// standard client and through Do alike.
func TestHeaderNetHTTPCannotSendIsRefusedBeforeJournaling(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
	bg := context.Background()
	for i, header := range []http.Header{
		{"X-Note": {"a\r\nX-Injected: 1"}},
		{"X-Note": {"a\x00b"}},
		{"Bad Name": {"v"}},
		{"": {"v"}},
	} {
		std := "std-" + string(rune('a'+i))
		req, err := http.NewRequestWithContext(idem.WithOperation(bg, std), http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
		require.NoError(t, err)
		for name, values := range header {
			req.Header[name] = values
		}
		_, err = c.StandardClient().Do(req)
		assert.ErrorIs(t, err, idem.ErrInvalidOp, "standard client, header %q", header)

		do := "do-" + string(rune('a'+i))
		_, err = c.Do(bg, idem.Op{ID: do, URL: "/orders", Header: header, Body: []byte(`{}`)})
		assert.ErrorIs(t, err, idem.ErrInvalidOp, "Do, header %q", header)

		for _, id := range []string{std, do} {
			_, err := j.Lookup(bg, "default", id)
			assert.ErrorIs(t, err, idem.ErrNotFound, "nothing journaled for %s", id)
		}
	}
	assert.Zero(t, hits.Load(), "nothing sent")
}
