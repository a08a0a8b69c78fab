package server_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

// outcomes records what OnOutcome saw.
type outcomes struct {
	mu   sync.Mutex
	seen []server.Outcome
}

func (o *outcomes) option() envOption {
	return func(c *server.Config) {
		c.OnOutcome = func(_ context.Context, out server.Outcome) {
			o.mu.Lock()
			defer o.mu.Unlock()
			o.seen = append(o.seen, out)
		}
	}
}

// last returns the latest outcome; OnOutcome runs after the answer was
// written, so the test waits for it.
func (o *outcomes) last(t *testing.T, n int) server.Outcome {
	t.Helper()
	require.Eventually(t, func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return len(o.seen) >= n
	}, 5*time.Second, time.Millisecond, "outcome %d was not reported", n)
	o.mu.Lock()
	defer o.mu.Unlock()
	require.Len(t, o.seen, n, "one outcome per keyed request")
	return o.seen[n-1]
}

func TestOnOutcomeReportsWhatTheMiddlewareDid(t *testing.T) {
	t.Parallel()
	var got outcomes
	g := newGate()
	store := &faultyStore{Store: server.NewMemoryStore()}
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			g.wait()
		}
		created(w, r)
	}, withStore(store), withTenantScope(), got.option(), func(c *server.Config) { c.LockTimeout = time.Hour })

	r := e.post("/orders", "k1", `{"n":1}`, "X-Tenant", "acme")
	require.Equal(t, http.StatusCreated, r.Status)
	assert.Equal(t, server.Outcome{Kind: server.OutcomeRan, Scope: "acme", Key: "k1", Status: http.StatusCreated}, got.last(t, 1))

	e.post("/orders", "k1", `{"n":1}`, "X-Tenant", "acme")
	assert.Equal(t, server.Outcome{Kind: server.OutcomeReplayed, Scope: "acme", Key: "k1", Status: http.StatusCreated}, got.last(t, 2))

	e.post("/orders", "k1", `{"n":2}`, "X-Tenant", "acme")
	assert.Equal(t, server.Outcome{Kind: server.OutcomeKeyReused, Scope: "acme", Key: "k1", Status: http.StatusUnprocessableEntity}, got.last(t, 3))

	e.do(http.MethodPost, "/orders", `{}`, "X-Tenant", "acme")
	assert.Equal(t, server.Outcome{Kind: server.OutcomeKeyInvalid, Status: http.StatusBadRequest}, got.last(t, 4))

	e.do(http.MethodGet, "/orders", "", "X-Tenant", "acme")
	e.status("k1", "X-Tenant", "acme")
	assert.Equal(t, server.OutcomeKeyInvalid, got.last(t, 4).Kind, "a method without keys and the status endpoint report nothing")

	// A held key: another request gets 409.
	held := make(chan reply, 1)
	go func() { held <- e.post("/orders", "k2", `{}`, "X-Tenant", "acme", "X-Hold", "1") }()
	g.waitEntered(t)
	e.post("/orders", "k2", `{}`, "X-Tenant", "acme")
	assert.Equal(t, server.Outcome{Kind: server.OutcomeInProgress, Scope: "acme", Key: "k2", Status: http.StatusConflict}, got.last(t, 5))

	// The holder's process is presumed dead: the next request takes over.
	e.clock.Advance(time.Hour + time.Second)
	e.post("/orders", "k2", `{}`, "X-Tenant", "acme")
	assert.Equal(t, server.Outcome{Kind: server.OutcomeRan, Scope: "acme", Key: "k2", Status: http.StatusCreated, TookOver: true}, got.last(t, 6))
	g.release()
	<-held
	assert.Equal(t, server.Outcome{Kind: server.OutcomeRan, Scope: "acme", Key: "k2", Status: http.StatusConflict}, got.last(t, 7),
		"the fenced first run answers 409")

	// The store fails to keep the response: the client is told to retry.
	store.failCompletes.Store(true)
	r = e.post("/orders", "k3", `{}`, "X-Tenant", "acme")
	assert.Equal(t, http.StatusConflict, r.Status)
	assert.Equal(t, server.Outcome{Kind: server.OutcomeRan, Scope: "acme", Key: "k3", Status: http.StatusConflict, StoreFailed: true}, got.last(t, 8))
	store.failCompletes.Store(false)

	// Too large a body.
	e.post("/orders", "k4", strings.Repeat("x", 2<<20), "X-Tenant", "acme")
	assert.Equal(t, server.Outcome{Kind: server.OutcomeKeyInvalid, Key: "k4", Status: http.StatusRequestEntityTooLarge}, got.last(t, 9))
}

func TestOnOutcomeReportsAClaimTheStoreRefused(t *testing.T) {
	t.Parallel()
	var got outcomes
	e := newEnv(t, created, withStore(refusingStore{server.NewMemoryStore()}), got.option())
	r := e.post("/orders", "k", `{}`)
	assert.Equal(t, http.StatusServiceUnavailable, r.Status)
	assert.Equal(t, server.Outcome{Kind: server.OutcomeStoreUnavailable, Key: "k", Status: http.StatusServiceUnavailable, StoreFailed: true}, got.last(t, 1))
	assert.Zero(t, e.calls.Load(), "nothing ran")
}

// refusingStore fails every claim, as a store that lost its disk would.
type refusingStore struct{ server.Store }

func (refusingStore) Claim(context.Context, server.ClaimRequest) (server.ClaimResult, error) {
	return server.ClaimResult{}, errInjected
}
