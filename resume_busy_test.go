package idem_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestBackgroundResumeTakesADeadOwnersOperationWhileAnotherIsSlow: a
// survivor whose background resume is driving one slow operation (its
// request held by the server) takes a SIGKILLed process's operation on
// the same SQLite journal with one of its free slots, while the slow one
// is still held: not once the pass that drives the slow one ends, which
// is up to RetryPolicy.Budget later.
func TestBackgroundResumeTakesADeadOwnersOperationWhileAnotherIsSlow(t *testing.T) {
	t.Parallel()
	var hold atomic.Bool
	holdCame := make(chan struct{}, 16)
	hold.Store(true)
	srv, slow := startSlowServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			holdCame <- struct{}{}
			if hold.Load() {
				<-r.Context().Done()
				return
			}
		}
		w.WriteHeader(http.StatusCreated)
	})
	path := filepath.Join(t.TempDir(), "ops.db")
	ctx := context.Background()
	j := openJournal(t, path)
	beginSlow(t, j, srv.URL)

	// Another process on the same journal, its request held by the server.
	child := startHoldChild(t, "IDEM_JOURNAL="+path, "IDEM_URL="+srv.URL, "IDEM_OP=charge-1", "IDEM_PATH=/hold")
	waitFor(t, holdCame, "the child's request")

	// The survivor.
	c := resumeTheSlowOneInBackground(t, j, srv.URL, slow)

	// The child's lease, read before the kill: right after it, the
	// survivor's pass may already have taken the operation over.
	dead, err := j.Lookup(ctx, "default", "charge-1")
	require.NoError(t, err)
	require.NoError(t, child.Signal(syscall.SIGKILL))
	_, _ = child.Wait()
	killed := time.Now()
	hold.Store(false)

	deadline := time.Now().Add(15 * time.Second)
	for {
		rec, err := j.Lookup(ctx, "default", "charge-1")
		require.NoError(t, err)
		if rec.State == idem.StateSucceeded {
			break
		}
		require.True(t, time.Now().Before(deadline),
			"the dead process's operation (lease of %q) was not taken while the survivor's slow operation ran: %s, leased by %q",
			dead.Lease.Owner, rec.State, rec.Lease.Owner)
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the dead process's operation settled %s after the kill", time.Since(killed).Round(time.Millisecond))
	assert.Zero(t, slow.ended.Load(), "the dead owner's operation was settled while the slow one was still held")
	slowRec, err := j.Lookup(ctx, "default", "slow-1")
	require.NoError(t, err)
	assert.Equal(t, c.Owner(), slowRec.Lease.Owner, "the slow operation is still the survivor's")
	h, err := j.History(ctx, dead.Key)
	require.NoError(t, err)
	var claim idem.Event
	for _, e := range h {
		if e.Kind == idem.EventClaim {
			claim = e
		}
	}
	assert.Equal(t, c.Owner(), claim.Owner, "the survivor claimed it")
	assert.Equal(t, "taken over from "+dead.Lease.Owner+": its owner is gone", claim.Detail)
}

// slowEndpoint holds every request to /slow until gate is closed or the
// request ends.
type slowEndpoint struct {
	came  chan struct{} // a request to /slow came
	gate  chan struct{}
	ended atomic.Int64 // requests to /slow answered
}

// startSlowServer starts a server whose /slow is a slowEndpoint, and
// which hands every other request, its body read, to other.
func startSlowServer(t *testing.T, other http.HandlerFunc) (*httptest.Server, *slowEndpoint) {
	t.Helper()
	slow := &slowEndpoint{came: make(chan struct{}, 16), gate: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path != "/slow" {
			other(w, r)
			return
		}
		slow.came <- struct{}{}
		select {
		case <-slow.gate:
		case <-r.Context().Done():
		}
		slow.ended.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	return srv, slow
}

// beginSlow journals operation slow-1, to /slow of url: never sent, due
// now.
func beginSlow(t *testing.T, j idem.Journal, url string) {
	t.Helper()
	c0, err := idem.New(idem.Config{Journal: j, BaseURL: url})
	require.NoError(t, err)
	_, err = c0.Begin(context.Background(), idem.Op{ID: "slow-1", URL: "/slow", Body: []byte(`{}`)})
	require.NoError(t, err)
	require.NoError(t, c0.Close())
}

// resumeTheSlowOneInBackground returns a client on j whose background
// resume pass takes slow-1 and stays on it for as long as slow holds its
// request, once that request came.
func resumeTheSlowOneInBackground(t *testing.T, j idem.Journal, url string, slow *slowEndpoint) *idem.Client {
	t.Helper()
	retry := fastRetry()
	retry.Budget = time.Minute
	c, err := idem.New(idem.Config{Journal: j, BaseURL: url, Retry: retry, AttemptTimeout: time.Minute,
		ResumeInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	t.Cleanup(func() { close(slow.gate) }) // before Close, which waits for the pass
	waitFor(t, slow.came, "the slow operation's request")
	return c
}

// waitFor waits for one signal on ch, failing the test after a bound that
// only a hang reaches.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(15 * time.Second):
		t.Fatalf("%s never came", what)
	}
}

// TestBackgroundResumeTakesANewlyDueOperationWhileAnotherIsSlow: an
// operation that becomes due while the background pass drives a slow one
// (its Do got a 503 asking for a second) is taken by a free slot of that
// pass, while the slow one is still held.
func TestBackgroundResumeTakesANewlyDueOperationWhileAnotherIsSlow(t *testing.T) {
	t.Parallel()
	var orders atomic.Int64
	srv, slow := startSlowServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/orders" && orders.Add(1) == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	ctx := context.Background()
	j := idem.NewMemoryJournal()
	beginSlow(t, j, srv.URL)
	c := resumeTheSlowOneInBackground(t, j, srv.URL, slow)

	_, err := c.Do(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
	require.Error(t, err, "the 503 asks for a second, more than the call waits")
	deadline := time.Now().Add(15 * time.Second)
	for {
		rec, err := c.Lookup(ctx, "", "order-1")
		require.NoError(t, err)
		if rec.State == idem.StateSucceeded {
			break
		}
		require.True(t, time.Now().Before(deadline),
			"the operation due again after a second was not taken while the background pass drove the slow one: %s, due %s",
			rec.State, rec.NextAttemptAt.Format(time.RFC3339Nano))
		time.Sleep(10 * time.Millisecond)
	}
	assert.Zero(t, slow.ended.Load(), "it was settled while the slow one was still held")
	assert.EqualValues(t, 2, orders.Load(), "sent again once, when it was due")
}
