package idem_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A Shutdown whose ctx ends while a call is in progress interrupts it and,
// since 383d87d, returns without waiting for the interrupted call to
// return (its finish is the same ended ctx). The caller who then wants
// the calls ended before it closes the journal calls Close, whose doc
// says it waits for them ("its last writes", up to 30 s): Close returns
// at once (the client is closed already), the interrupted call still
// running; a journal closed then fails that call's last write, and its
// lease stays its owner's. Correct: once Close returned, every call it
// interrupted or that Shutdown interrupted has returned, its lease let go.
func TestCloseAfterAnEndedShutdownWaitsForTheInterruptedCall(t *testing.T) {
	t.Parallel()
	arrived, release := make(chan struct{}, 10), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	path := filepath.Join(t.TempDir(), "ops.db")
	j := openJournal(t, path)
	// The interrupted call's last journal write is slowed (its
	// transition's hook, which runs on the call's goroutine, sleeps), so
	// that a Close that did not wait for it would return first.
	var shutting, lastWritten atomic.Bool
	onTransition := func(idem.Transition) {
		if shutting.Load() {
			time.Sleep(200 * time.Millisecond)
			lastWritten.Store(true)
		}
	}
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Owner: "w-shut", Retry: fastRetry(), OnTransition: onTransition})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(context.Background(), idem.Op{ID: "interrupted", URL: "/slow"})
		done <- err
	}()
	<-arrived
	sctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	shutting.Store(true)
	require.ErrorIs(t, c.Shutdown(sctx), context.DeadlineExceeded)
	require.NoError(t, c.Close())
	// Once Close returned, the interrupted call has made its last write,
	// its lease let go, on the journal still open. (Whether the caller's
	// goroutine has received Do's return yet, the test cannot tell: Close
	// waits for the call, not for its caller.)
	assert.True(t, lastWritten.Load(), "Close returned while the call Shutdown interrupted was still journaling")
	rec, err := j.Lookup(context.Background(), "default", "interrupted")
	require.NoError(t, err)
	assert.Empty(t, rec.Lease.Owner, "Close returned while the call Shutdown interrupted still held its lease")
	assert.ErrorIs(t, <-done, idem.ErrOutcomeUnknown)
	require.NoError(t, j.Close())
	again := openJournal(t, path)
	rec, err = again.Lookup(context.Background(), "default", "interrupted")
	require.NoError(t, err)
	assert.Empty(t, rec.Lease.Owner, "the interrupted call's lease is let go")
}

// Shutdown whose ctx ends while a POST is in flight interrupts the call:
// the request is canceled on the wire too, so the server's handler sees
// its request's context end (its client gone), and no connection or
// goroutine of the attempt outlives the call (TestMain's goleak). A
// net/http server watches the connection only once the handler has read
// the request's body, when there is one: a POST without a body must go
// as one (Content-Length: 0), not as an empty chunked body, which its
// handler, reading nothing, would never see end.
func TestShutdownCancelsTheInterruptedRequestOnTheWire(t *testing.T) {
	t.Parallel()
	for name, body := range map[string][]byte{"no body, not read": nil, "a body, read": []byte(`{}`)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			arrived, canceled, release := make(chan struct{}, 10), make(chan struct{}, 10), make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if body != nil {
					_, _ = io.ReadAll(r.Body)
				}
				arrived <- struct{}{}
				select {
				case <-r.Context().Done():
					canceled <- struct{}{}
				case <-release:
				}
			}))
			t.Cleanup(srv.Close)
			t.Cleanup(func() { close(release) })
			j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
			c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Owner: "w-wire", Retry: fastRetry()})
			require.NoError(t, err)
			done := make(chan error, 1)
			go func() {
				_, err := c.Do(context.Background(), idem.Op{ID: "on-the-wire", URL: "/slow", Body: body})
				done <- err
			}()
			<-arrived
			sctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			require.ErrorIs(t, c.Shutdown(sctx), context.DeadlineExceeded)
			require.NoError(t, c.Close())
			assert.ErrorIs(t, <-done, idem.ErrOutcomeUnknown)
			select {
			case <-canceled:
			case <-time.After(10 * time.Second): // a bound for a failing run, not a measure
				t.Error("the server's handler still waits on its request 10 s after the call was interrupted")
			}
		})
	}
}
