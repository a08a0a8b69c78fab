package server_test

import (
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/wire"
)

// TestEveryKeyTheMiddlewareAcceptsCanBeAskedAbout: "." and ".." are
// tokens, so the middleware runs and stores a request under them, but the
// status endpoint, mounted as documented (GET /idempotency/{key}) and asked
// as the idem client asks (base + "/" + url.PathEscape(key), which leaves
// dots alone), never sees them: ServeMux cleans /idempotency/.. to / and
// answers 307, so the client that needs the key's outcome gets a redirect
// to another resource. Either such a key is refused up front (400
// key-invalid), or its status is answered.
func TestEveryKeyTheMiddlewareAcceptsCanBeAskedAbout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, created)
	noRedirects := *e.srv.Client()
	noRedirects.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for _, key := range []string{".", ".."} {
		r := e.post("/orders", key, `{}`)
		if r.Status == http.StatusBadRequest {
			assert.Equal(t, wire.ProblemKeyInvalid, r.problem(t).Type, "%q refused up front", key)
			continue
		}
		require.Equal(t, http.StatusCreated, r.Status, key)

		resp, err := noRedirects.Get(e.srv.URL + "/idempotency/" + url.PathEscape(key))
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		s, _, err := wire.DecodeStatus(resp.StatusCode, body, key)
		if assert.NoError(t, err, "key %q: the status endpoint answers about it, not %d %s %q", key, resp.StatusCode, resp.Header.Get("Location"), body) {
			assert.Equal(t, wire.StateCompleted, s.State, key)
		}
	}
}
