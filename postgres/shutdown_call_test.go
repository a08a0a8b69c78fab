package postgres_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgproxy"
)

// Shutdown's doc: "Every step honours ctx: once it ends, Shutdown returns
// its error at once". A call whose answer came is journaling its outcome
// when Shutdown begins, and the database holds its replies: Shutdown
// returns ctx's error when ctx ends, and the call's write, which no
// interruption stops (the answer is what the journal is for), goes on and
// is not lost once the database answers again.
func TestShutdownEndsWithItsContextWhileACallsOutcomeIsBeingWritten(t *testing.T) {
	t.Parallel()
	p, c, done, direct := callJournalingItsOutcome(t)
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	err := returnsWithin(t, 15*time.Second, "Shutdown", func() error { return c.Shutdown(sctx) })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	p.Delay(0)
	require.NoError(t, <-done, "the call's outcome was written after Shutdown returned")
	rec, err := direct.Lookup(ctx, "default", "held")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
}

// callJournalingItsOutcome starts a call whose 201 has come and whose
// journal (through p) holds its replies while the call journals it; done
// says when the call returned.
func callJournalingItsOutcome(t *testing.T) (p *pgproxy.Proxy, c *idem.Client, done chan error, direct *postgres.Journal) {
	t.Helper()
	p, j, direct := proxiedJournal(t)
	arrived, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Owner: "w-shutdown-call"})
	require.NoError(t, err)
	done = make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, idem.Op{ID: "held", Method: http.MethodPost, URL: "/orders", Body: []byte(`{}`)})
		done <- err
	}()
	<-arrived
	p.Delay(time.Hour)
	t.Cleanup(func() { p.Delay(0) })
	close(release)
	return p, c, done, direct
}

// Close's doc: it waits for the calls in progress to return and gives the
// journal up to 30 s for "the calls' last writes". After a Shutdown whose
// ctx ended while a call still journaled its 201 (the write goes on), a
// process calls Close to wait for that write before it closes the journal
// and exits. Close returns nil at once instead (the client is already
// closed: stop returns as soon as Shutdown's stop did), the call still
// writing: a journal closed then loses the answer (the operation reads
// in_flight), and the call's goroutine outlives Close. Correct: Close
// waits, up to its 30 s, for the interrupted call's last write.
func TestCloseAfterAnEndedShutdownWaitsForTheCallsLastWrite(t *testing.T) {
	t.Parallel()
	p, c, done, direct := callJournalingItsOutcome(t)
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	require.ErrorIs(t, c.Shutdown(sctx), context.DeadlineExceeded)
	// The database answers again a while after Close is called: a Close
	// that waits sees the write done within its 30 s.
	go func() { time.Sleep(2 * time.Second); p.Delay(0) }()
	require.NoError(t, c.Close())
	select {
	case err := <-done:
		require.NoError(t, err)
	default:
		t.Error("Close returned while the interrupted call was still journaling its outcome")
		require.NoError(t, <-done)
	}
	rec, err := direct.Lookup(ctx, "default", "held")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
}
