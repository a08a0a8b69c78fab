package server_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/server"
)

// TestOddRoutesAndScopesRunOnce: a path that decodes to bytes that are not
// UTF-8 or to a NUL, and a scope that is not UTF-8 or as long as a token,
// run once and replay, as any other request does.
func TestOddRoutesAndScopesRunOnce(t *testing.T) {
	t.Parallel()
	long := make([]byte, 3072)
	for i := range long {
		long[i] = 'a' + byte(i*7%26)
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, created, withStore(newStore(t)), withScope(func(r *http.Request) string {
				return r.Header.Get("X-Tenant") + "\xff" + string(long)
			}))
			for i, path := range []string{"/files/caf%E9.txt", "/files/a%00b", "/orders"} {
				key := fmt.Sprint("k", i)
				first := e.post(path, key, `{}`, "X-Tenant", "t\xe9")
				require.Equal(t, http.StatusCreated, first.Status, "%s: %s", path, first.Body)
				again := e.post(path, key, `{}`, "X-Tenant", "t\xe9")
				assert.Equal(t, http.StatusCreated, again.Status, path)
				assert.True(t, again.replayed(), "%s: the retry is answered from the store", path)
			}
			assert.EqualValues(t, 3, e.calls.Load(), "each request ran once")
		})
	}
}

// TestAnInputTheStoreCannotKeepIs400: a store that cannot keep a request
// (ErrUnstorable) gets it answered 400 with the store's reason, not 503,
// which would have the client send the same request again.
func TestAnInputTheStoreCannotKeepIs400(t *testing.T) {
	t.Parallel()
	var got outcomes
	e := newEnv(t, created, withStore(unstorableStore{server.NewMemoryStore()}), got.option())
	r := e.post("/orders", "k", `{}`)
	require.Equal(t, http.StatusBadRequest, r.Status)
	p := r.problem(t)
	assert.Equal(t, wire.ProblemUnstorable, p.Type)
	assert.Contains(t, p.Detail, "scope is 9000 bytes, the most this store keeps is 4096", "the problem says why")
	assert.Empty(t, r.Header.Get("Retry-After"), "nothing invites the same request again")
	assert.Equal(t, server.Outcome{Kind: server.OutcomeKeyInvalid, Key: "k", Status: http.StatusBadRequest}, got.last(t, 1))
	assert.Zero(t, e.calls.Load(), "nothing ran")
}

// unstorableStore refuses every claim as a store with a size limit would.
type unstorableStore struct{ server.Store }

func (unstorableStore) Claim(context.Context, server.ClaimRequest) (server.ClaimResult, error) {
	return server.ClaimResult{}, fmt.Errorf("%w: the scope is 9000 bytes, the most this store keeps is 4096", server.ErrUnstorable)
}
