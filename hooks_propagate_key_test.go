package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem"
)

// Hooks.Propagate "must not set the key's header"; Config.Authorize, which
// runs at the same point, is held to the same rule by the client (an
// Authorize that sets the key's header fails as if it returned an error,
// and nothing is sent). A Propagate that writes the header anyway, here
// a per-request ID under the key's name as a generic tracing helper might,
// sends each attempt under a key of its own: the server executes the
// retry as a new request. One logical operation must go out under one
// key, or not at all.
func TestHooksPropagateCannotChangeTheKeyOnTheWire(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // retried with the same key
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), Hooks: idem.Hooks{
		Propagate: func(_ context.Context, h http.Header) {
			h.Set("Idempotency-Key", fmt.Sprintf("req-%d", calls.Add(1)))
		},
	}})
	res, err := c.Do(context.Background(), orderOp("op-1", 1))
	keys := map[string]bool{}
	for _, k := range srv.received() {
		keys[k] = true
	}
	if err == nil {
		assert.Len(t, keys, 1, "one operation reached the server under %d keys: %v", len(keys), srv.received())
		assert.Equal(t, map[string]bool{res.Key: true}, keys, "the server never saw the journaled key %s", res.Key)
		return
	}
	assert.Empty(t, srv.received(), "refused, but only after sending: %v", err)
}
