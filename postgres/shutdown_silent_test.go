package postgres_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres/internal/pgproxy"
)

// silence makes the database go silent for p's sessions: the open ones
// (their server side ended, nothing comes back, as behind a NAT or
// firewall that forgot them) and the new ones (each message of the server
// held for 20 s): TCP silence, not a reset.
func silence(t *testing.T, p *pgproxy.Proxy) {
	t.Helper()
	p.Delay(20 * time.Second)
	pids := p.BackendPIDs()
	require.NotEmpty(t, pids)
	for _, pid := range pids {
		p.Blackhole(pid)
	}
	// The silenced sessions stay silent for good: the cleanups' own calls
	// on them (the journal's Close ending its owners, the pool's Close)
	// would each wait out a timeout of their own (some 15 s in all) on
	// what the test has proved already. Cut, they fail at once.
	t.Cleanup(func() { p.Delay(0); p.CutAll() })
}

// returnsWithin runs fn and fails the test unless it returns within d, a
// bound for a failing run (a hang), not a measure.
func returnsWithin(t *testing.T, d time.Duration, what string, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- fn() }()
	select {
	case err := <-done:
		t.Logf("%s returned after %v: %v", what, time.Since(start), err)
		return err
	case <-time.After(d):
		t.Fatalf("%s had not returned %v after it was called, its context ending 1 s after the call: it waits on the silent database past its context", what, d)
		return nil
	}
}

// warmClient returns a client on j that has run one Do, so that its pool
// holds connections and the journal a deferred outcome.
func warmClient(t *testing.T, j idem.Journal, owner string) *idem.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Owner: owner})
	require.NoError(t, err)
	_, err = c.Do(ctx, idem.Op{ID: "warm", Method: http.MethodPost, URL: "/orders", Body: []byte(`{}`)})
	require.NoError(t, err)
	return c
}

// Shutdown's doc: calls in progress go on "until they return or ctx
// ends (then they are interrupted ... and Shutdown returns ctx's error)".
// A process stopping on SIGTERM gives it a context of the seconds its
// orchestrator grants. With the database gone silent (TCP silence, not a
// reset), Shutdown(ctx) with a 1 s deadline and no call in progress
// returns only after some 40 s: the journal's Sync runs under a context of
// its own (30 s, its caller's deadline dropped) and leaving the owners
// under another (10 s). Found: it had not returned 30 s after the call;
// it returns after about 40 s.
func TestShutdownWhileTheDatabaseIsSilentEndsWithItsContext(t *testing.T) {
	t.Parallel()
	p, j, _ := proxiedJournal(t)
	c := warmClient(t, j, "w-shutdown")
	silence(t, p)
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = returnsWithin(t, 30*time.Second, "Shutdown", func() error { return c.Shutdown(sctx) })
}

// Client.Close's doc: it "makes every journal write the client made
// durable (Journal.Sync)". When it cannot (the database is down), its
// error must say so, as Shutdown's does ("making the journal durable"):
// a nil error tells the process that every outcome is on disk. Found:
// Close returns nil at once while Journal.Sync fails, because Close drops
// every error that matches context.Canceled, and Shutdown joins the Sync
// error to that very Canceled (Close's own, already cancelled context).
// The obvious fix: Close should drop only the Canceled, not the join.
func TestCloseSaysWhenItCouldNotMakeTheJournalDurable(t *testing.T) {
	t.Parallel()
	p, j, _ := proxiedJournal(t)
	c := warmClient(t, j, "w-close")
	p.Refuse(time.Hour)
	p.CutAll()
	require.Error(t, j.Sync(ctx), "the database is down: nothing can be made durable")
	err := c.Close()
	require.Error(t, err, "Close could not make the client's writes durable, and returned nil")
	require.ErrorContains(t, err, "durable")
}
