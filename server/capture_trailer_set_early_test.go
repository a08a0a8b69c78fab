package server_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAnnouncedTrailerSetBeforeTheBodyIsSentWithItsFinalValue: a handler
// announces a trailer (Trailer: X-Sum), sets a placeholder value before
// WriteHeader and the real value once the body is written. Without the
// middleware net/http sends the placeholder in the header and the final
// value as the trailer (it reads the announced trailers from the handler's
// live header when the handler returns). keepTrailers skips an announced
// name that was in the header at WriteHeader, so the middleware's first
// answer and every replay send the placeholder as the trailer: the final
// value, the one the handler computed from its body, is lost.
func TestAnnouncedTrailerSetBeforeTheBodyIsSentWithItsFinalValue(t *testing.T) {
	t.Parallel()
	handler := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		w.Header().Set("X-Sum", "pending")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "hello")
		w.Header().Set("X-Sum", "5d41402a")
	}
	trailer := func(srv *httptest.Server) string {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		_, err = io.ReadAll(resp.Body) // trailers arrive after the body
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		return resp.Trailer.Get("X-Sum")
	}
	plain := httptest.NewServer(http.HandlerFunc(handler))
	t.Cleanup(plain.Close)
	want := trailer(plain)
	require.Equal(t, "5d41402a", want, "net/http without the middleware")

	e := newEnv(t, handler)
	assert.Equal(t, want, trailer(e.srv), "the first answer's trailer")
	assert.Equal(t, want, trailer(e.srv), "the replay's trailer")
	assert.EqualValues(t, 1, e.calls.Load())
}
