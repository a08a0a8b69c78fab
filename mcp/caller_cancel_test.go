package mcp_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	idemmcp "github.com/idemkit/idem/mcp"
)

// One call's end (its step's deadline, a canceled context) is no fault of
// the session the runtime's other calls share: they go on undisturbed,
// each in one attempt.
func TestCallerACanceledCallLeavesTheOthersAlone(t *testing.T) {
	m := &mailServer{started: make(chan struct{}, 2), release: make(chan struct{})}
	j := openSQLite(t)
	c := openCaller(t, j, serveMail(t, m, newGuard(t, idemmcp.GuardConfig{}), nil))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var errA, errB error
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, errA = c.Call(ctx, "call_a", "send_email", emailIn{To: "a@example.com"})
	}()
	go func() {
		defer wg.Done()
		_, errB = c.Call(context.Background(), "call_b", "send_email", emailIn{To: "b@example.com"})
	}()
	<-m.started
	<-m.started
	cancel()
	done := make(chan struct{})
	go func() {
		// call_a ends first: its context is canceled while both wait.
		for {
			rec, err := j.Lookup(context.Background(), "mcp", "call_a")
			if err == nil && rec.State != idem.StateInFlight {
				break
			}
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		close(m.release)
	}()
	wg.Wait()
	close(done)
	assert.ErrorIs(t, errA, idem.ErrOutcomeUnknown)
	require.NoError(t, errB)
	rec, err := j.Lookup(context.Background(), "mcp", "call_b")
	require.NoError(t, err)
	assert.Equal(t, 1, rec.Attempts, "call_b was not cut by call_a's end: one attempt")
	assert.EqualValues(t, 2, m.runs.Load())
}
