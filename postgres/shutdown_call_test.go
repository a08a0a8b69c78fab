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
)

// Shutdown's doc: "Every step honours ctx: once it ends, Shutdown returns
// its error at once". A call whose answer came is journaling its outcome
// when Shutdown begins, and the database holds its replies: Shutdown
// returns ctx's error when ctx ends, and the call's write, which no
// interruption stops (the answer is what the journal is for), goes on and
// is not lost once the database answers again.
func TestShutdownEndsWithItsContextWhileACallsOutcomeIsBeingWritten(t *testing.T) {
	t.Parallel()
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
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, idem.Op{ID: "held", Method: http.MethodPost, URL: "/orders", Body: []byte(`{}`)})
		done <- err
	}()
	<-arrived
	p.Delay(time.Hour)
	t.Cleanup(func() { p.Delay(0) })
	close(release)
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	err = returnsWithin(t, 15*time.Second, "Shutdown", func() error { return c.Shutdown(sctx) })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	p.Delay(0)
	require.NoError(t, <-done, "the call's outcome was written after Shutdown returned")
	rec, err := direct.Lookup(ctx, "default", "held")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
}
