package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTrailersTheHandlerSetsReachTheClientAndTheReplay: a handler that
// announces a trailer (Trailer: X-Sum) and sets its value after writing the
// body, or sets one with http.TrailerPrefix after the body, has its
// trailers sent as net/http sends them without the middleware, on the first
// answer and on the replay ("status, headers and body byte for byte"). The
// capture keeps only the header as it was at WriteHeader, so the values set
// after it are lost: the client is promised X-Sum and gets it empty.
func TestTrailersTheHandlerSetsReachTheClientAndTheReplay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "hello")
		w.Header().Set("X-Sum", "5d41402a")
		w.Header().Set(http.TrailerPrefix+"X-Late", "late")
	})
	for _, want := range []string{"first answer", "replay"} {
		req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := e.srv.Client().Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body) // trailers arrive after the body
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusCreated, resp.StatusCode, want)
		require.Equal(t, "hello", string(body), want)
		assert.Equal(t, "5d41402a", resp.Trailer.Get("X-Sum"), "%s: the announced trailer's value", want)
		assert.Equal(t, "late", resp.Trailer.Get("X-Late"), "%s: the TrailerPrefix trailer", want)
	}
	assert.EqualValues(t, 1, e.calls.Load())
}
