package server_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/server"
)

func TestStatusOfACompletedKeyCarriesTheStoredResponse(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Location", "/orders/9")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte{0, 1, 2, 0xff})
	})
	first := e.post("/orders", "k", "{}")
	s, body, r := e.status("k")
	assert.Equal(t, http.StatusOK, r.Status)
	assert.Equal(t, "application/json", r.Header.Get("Content-Type"))
	assert.Equal(t, "k", s.Key)
	assert.Equal(t, wire.StateCompleted, s.State)
	require.NotNil(t, s.Response)
	assert.Equal(t, http.StatusCreated, s.Response.Status)
	assert.Equal(t, "base64", s.Response.BodyEncoding, "a body that is not UTF-8 travels as base64")
	assert.Equal(t, first.Body, string(body), "the decoded body is the stored body byte for byte")
	assert.Equal(t, "/orders/9", s.Response.Header.Get("Location"))
	assert.Equal(t, "application/octet-stream", s.Response.Header.Get("Content-Type"))
	assert.EqualValues(t, 1, e.calls.Load(), "a status query runs nothing")
}

func TestStatusWhileProcessing(t *testing.T) {
	t.Parallel()
	g := newGate()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) { g.wait(); created(w, r) })
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.post("/orders", "k", "{}")
	}()
	g.waitEntered(t)
	s, body, r := e.status("k")
	assert.Equal(t, http.StatusOK, r.Status)
	assert.Equal(t, wire.StateProcessing, s.State)
	assert.Nil(t, s.Response)
	assert.Nil(t, body)
	g.release()
	<-done
	s, _, _ = e.status("k")
	assert.Equal(t, wire.StateCompleted, s.State)
}

func TestStatusOfAnUnknownKeyIs404NotFound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, created)
	s, _, r := e.status("never-seen")
	assert.Equal(t, http.StatusNotFound, r.Status)
	assert.Equal(t, wire.StateNotFound, s.State)
	assert.Equal(t, "never-seen", s.Key)
}

func TestStatusOfAReleasedKeyIsNotFound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
	}, func(c *server.Config) { c.StorePolicy = server.SkipServerErrors })
	e.post("/orders", "k", "{}")
	s, _, _ := e.status("k")
	assert.Equal(t, wire.StateNotFound, s.State)
}

func TestStatusAnswersGETOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, created)
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		// Mounted without a method in the pattern, so that the handler
		// itself decides.
		mux := http.NewServeMux()
		mux.Handle("/status/{key}", e.mw.StatusHandler())
		srv := httptest.NewServer(mux)
		req, _ := http.NewRequest(method, srv.URL+"/status/k", nil)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		srv.Close()
		assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, method)
		assert.Equal(t, "GET, HEAD", resp.Header.Get("Allow"), "HEAD is GET without the body")
	}
}

func TestStatusKeyFromTheLastPathSegment(t *testing.T) {
	t.Parallel()
	e := newEnv(t, created)
	e.post("/orders", `"a/b c"`, "{}")
	e.post("/orders", "plain", "{}")
	// Mounted on a prefix, with no {key} wildcard.
	srv := httptest.NewServer(http.StripPrefix("/api", e.mw.StatusHandler()))
	defer srv.Close()
	get := func(path, key string) (int, wire.Status) {
		resp, err := srv.Client().Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		s, _, err := wire.DecodeStatus(resp.StatusCode, b, key)
		if resp.StatusCode != http.StatusBadRequest {
			require.NoError(t, err)
		}
		return resp.StatusCode, s
	}
	code, s := get("/api/idempotency/plain", "plain")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "plain", s.Key)
	code, s = get("/api/idempotency/"+url.PathEscape("a/b c"), "a/b c")
	assert.Equal(t, http.StatusOK, code, "an escaped slash stays inside the key")
	assert.Equal(t, "a/b c", s.Key)
	code, _ = get("/api/idempotency/", "")
	assert.Equal(t, http.StatusBadRequest, code, "a path without a key is a bad request, not not_found")
}

func TestStatusKeyThroughPathValueMayHoldASlash(t *testing.T) {
	t.Parallel()
	e := newEnv(t, created)
	e.post("/orders", `"a/b"`, "{}")
	r := e.do(http.MethodGet, "/idempotency/"+url.PathEscape("a/b"), "")
	st, _, err := wire.DecodeStatus(r.Status, []byte(r.Body), "a/b")
	require.NoError(t, err)
	assert.Equal(t, wire.StateCompleted, st.State)
}

func TestStatusRejectsAKeyOverTheLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, created, func(c *server.Config) { c.MaxKeyLength = 3 })
	r := e.do(http.MethodGet, "/idempotency/abcd", "")
	assert.Equal(t, http.StatusBadRequest, r.Status)
	assert.Equal(t, wire.ProblemKeyInvalid, r.problem(t).Type)
}

func TestStatusStoreFailureIs503NeverNotFound(t *testing.T) {
	t.Parallel()
	store := openSQLite(t)
	e := newEnv(t, created, withStore(store))
	e.post("/orders", "k", "{}")
	require.NoError(t, store.Close())
	r := e.do(http.MethodGet, "/idempotency/k", "")
	assert.Equal(t, http.StatusServiceUnavailable, r.Status)
	assert.Equal(t, wire.ProblemStoreFailed, r.problem(t).Type)
	_, _, err := wire.DecodeStatus(r.Status, []byte(r.Body), "k")
	assert.ErrorIs(t, err, wire.ErrBadStatus, "a client reads the failure as unknown, never as not_found")
}

// TestStatusEndpointBehindTheRoutesAuthentication mounts the status
// endpoint as it must be: behind the same authentication as the routes,
// with Scope reading the tenant that authentication established. A caller
// learns about its own keys only: another tenant's key is not_found, and
// never carries its body.
func TestStatusEndpointBehindTheRoutesAuthentication(t *testing.T) {
	t.Parallel()
	type tenantKey struct{}
	tokens := map[string]string{"Bearer token-a": "tenant-a", "Bearer token-b": "tenant-b"}
	authenticate := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tenant, ok := tokens[r.Header.Get("Authorization")]
			if !ok {
				http.Error(w, "unauthenticated", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)))
		})
	}
	e := newWrappedEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("secret of " + r.Context().Value(tenantKey{}).(string)))
	}, authenticate, func(c *server.Config) {
		c.Scope = func(r *http.Request) string { return r.Context().Value(tenantKey{}).(string) }
	})

	first := e.post("/orders", "k", "{}", "Authorization", "Bearer token-a")
	require.Equal(t, http.StatusCreated, first.Status)

	s, body, r := e.status("k", "Authorization", "Bearer token-a")
	assert.Equal(t, http.StatusOK, r.Status)
	assert.Equal(t, wire.StateCompleted, s.State)
	assert.Equal(t, "secret of tenant-a", string(body), "the owner gets its stored response")

	s, _, r = e.status("k", "Authorization", "Bearer token-b")
	assert.Equal(t, http.StatusNotFound, r.Status)
	assert.Equal(t, wire.StateNotFound, s.State, "another tenant's key is not found in this tenant's scope")
	assert.NotContains(t, r.Body, "secret", "and its body is never sent")

	anon := e.do(http.MethodGet, "/idempotency/k", "")
	assert.Equal(t, http.StatusUnauthorized, anon.Status, "the status endpoint answers authenticated callers only")
	assert.NotContains(t, anon.Body, "secret")

	other := e.post("/orders", "k", "{}", "Authorization", "Bearer token-b")
	assert.Equal(t, "secret of tenant-b", other.Body, "the same key and payload from another tenant is that tenant's own request")
	assert.False(t, other.replayed())
	assert.EqualValues(t, 2, e.calls.Load())
}
