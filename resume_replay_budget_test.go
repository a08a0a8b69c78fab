package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// ReplayStatus (the default checker) now spends the retry budget on each
// replay, and nothing but a first attempt deposits. A process restarting
// after a crash, whose Resume takes up the operations left in flight,
// makes no first attempt: its budget is the floor (10 × MinRetriesPerSecond
// tokens), and a pass stops replaying once it is spent, though the server
// is healthy and answers every replay at once with the stored answer.
// Here 150 operations whose answers were lost, a server that answers each
// replay 201: one Resume pass leaves a third of them unknown with
// ErrRetryBudgetExhausted. The budget is there to stop a retry storm
// against a failing server, not recovery against one that answers.
func TestResumeAfterACrashIsNotStarvedByTheRetryBudget(t *testing.T) {
	t.Parallel()
	const ops = 150
	var lose atomic.Bool
	lose.Store(true)
	var mu sync.Mutex
	stored := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/idempotency/") {
			w.WriteHeader(http.StatusServiceUnavailable) // the crashed process's status checks fail
			return
		}
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		replay := stored[key]
		stored[key] = true
		mu.Unlock()
		if lose.Load() {
			dropConn(w)
			return
		}
		if replay {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
	before, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/idempotency"),
		Retry: idem.RetryPolicy{MaxAttempts: 1, MaxStatusChecks: 1, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond}})
	require.NoError(t, err)
	ctx := context.Background()
	for i := range ops {
		_, err := before.Do(ctx, orderOp(fmt.Sprint("op-", i), 1))
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	}
	require.NoError(t, before.Close())
	lose.Store(false)
	time.Sleep(5 * time.Millisecond) // past the 1 ms backoff: all due

	after, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry()}) // ReplayStatus
	rep, err := after.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, ops, rep.Claimed)
	assert.Equal(t, ops, rep.Succeeded, "one Resume pass against a server that answers every replay: %+v", rep)
	if rep.Unknown > 0 {
		for rec, err := range j.List(ctx, idem.Filter{States: []idem.State{idem.StateUnknown}}) {
			if err == nil {
				t.Logf("left unknown: %s", rec.LastError)
			}
			break
		}
	}
}
