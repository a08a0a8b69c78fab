package idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A Config.Authorize that fails sends nothing: it is not an attempt, the
// call does not retry it (it would fail the same way), and the error says
// that authorization failed, wrapping the application's error. The
// operation stays pending and is sent by the next Do or Resume once
// Authorize works.
func TestAFailingAuthorizeIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	errNoToken := errors.New("token service unavailable")
	var calls atomic.Int32
	var broken atomic.Bool
	broken.Store(true)
	policy := fastRetry()
	policy.MaxAttempts = 5
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy, Authorize: func(r *http.Request) error {
		calls.Add(1)
		if broken.Load() {
			return errNoToken
		}
		r.Header.Set("Authorization", "Bearer t")
		return nil
	}})
	ctx := context.Background()
	op := idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)}

	_, err := c.Do(ctx, op)
	require.ErrorIs(t, err, idem.ErrNotSent)
	require.ErrorIs(t, err, errNoToken, "errors.Is finds Authorize's own error")
	assert.Contains(t, err.Error(), "Config.Authorize failed")
	require.ErrorIs(t, err, idem.ErrAuthorizeFailed)
	assert.NotContains(t, err.Error(), "attempt(s)", "nothing was sent, so no attempt is reported")
	var oe *idem.OperationError
	require.ErrorAs(t, err, &oe)
	assert.Zero(t, oe.Attempts)
	assert.Equal(t, int32(1), calls.Load(), "Authorize is not retried within the call")
	assert.Empty(t, srv.received(), "nothing reached the server")
	rec, err := j.Lookup(ctx, "default", "order-1")
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, rec.State)
	assert.Contains(t, rec.LastError, "Config.Authorize failed")

	broken.Store(false)
	res, err := c.Do(ctx, op)
	require.NoError(t, err)
	assert.Equal(t, 1, res.Attempts, "the one attempt that was sent")
	assert.Len(t, srv.received(), 1)
}

// A status check whose Authorize fails is not repeated either: every
// further check would fail the same way. The operation stays unknown.
func TestAFailingAuthorizeEndsTheStatusChecks(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		dropConn(w) // the attempt's answer is lost: unknown
	})
	errNoToken := errors.New("token service unavailable")
	var checks atomic.Int32
	policy := fastRetry()
	policy.MaxAttempts = 1
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy, Status: idem.StatusEndpoint(srv.URL + "/idempotency"),
		Authorize: func(r *http.Request) error {
			if info, _ := idem.OperationFrom(r.Context()); info.StatusCheck {
				checks.Add(1)
				return errNoToken
			}
			return nil
		}})
	_, err := c.Do(context.Background(), idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.ErrorIs(t, err, idem.ErrAuthorizeFailed)
	require.ErrorIs(t, err, errNoToken)
	assert.Equal(t, int32(1), checks.Load(), "the status check is not repeated when Authorize fails")
}

// failingAfter is a Config.Authorize that works n times, then fails with
// errNoToken until fixed.
type failingAfter struct {
	calls, ok atomic.Int32
	fixed     atomic.Bool
}

var errNoToken = errors.New("token service unavailable")

func (f *failingAfter) authorize(r *http.Request) error {
	f.calls.Add(1)
	if f.ok.Add(-1) < 0 && !f.fixed.Load() {
		return errNoToken
	}
	r.Header.Set("Authorization", "Bearer t")
	return nil
}

// An Authorize that fails on a later attempt (a retry within the call)
// sends nothing and counts nothing either: the journal holds only the
// attempt that was sent, the error says so and carries Authorize's own,
// and the next Do sends the operation with the attempt counted once.
func TestAFailingAuthorizeOnARetryIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	auth := &failingAfter{}
	auth.ok.Store(1)
	policy := fastRetry()
	policy.MaxAttempts = 5
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy, Authorize: auth.authorize})
	ctx := context.Background()
	op := idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)}

	_, err := c.Do(ctx, op)
	require.ErrorIs(t, err, idem.ErrAuthorizeFailed)
	require.ErrorIs(t, err, errNoToken)
	var oe *idem.OperationError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, 1, oe.Attempts, "the one attempt that was sent: %v", err)
	assert.Contains(t, err.Error(), "[1 attempt(s)]")
	assert.Equal(t, int32(2), auth.calls.Load(), "Authorize is not retried within the call")
	assert.Len(t, srv.received(), 1)
	rec, err := j.Lookup(ctx, "default", "order-1")
	require.NoError(t, err)
	assert.Equal(t, 1, rec.Attempts, "the journal counts the attempt that was sent, not the one Authorize stopped")

	auth.fixed.Store(true)
	res, err := c.Do(ctx, op)
	require.NoError(t, err)
	assert.Equal(t, 2, res.Attempts, "two attempts were sent")
	assert.Len(t, srv.received(), 2)
}

// An Authorize that fails on a replay made to learn the outcome (the
// default status check) counts no attempt: the operation stays unknown
// with the one attempt that was sent.
func TestAFailingAuthorizeOnAReplayIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		dropConn(w) // the attempt's answer is lost: unknown
	})
	auth := &failingAfter{}
	auth.ok.Store(1)
	policy := fastRetry()
	policy.MaxAttempts = 1
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy, Authorize: auth.authorize})
	ctx := context.Background()
	_, err := c.Do(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.ErrorIs(t, err, idem.ErrAuthorizeFailed)
	require.ErrorIs(t, err, errNoToken)
	var oe *idem.OperationError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, 1, oe.Attempts, "%v", err)
	assert.Len(t, srv.received(), 1, "the replay was not sent")
	rec, err := j.Lookup(ctx, "default", "order-1")
	require.NoError(t, err)
	assert.Equal(t, idem.StateUnknown, rec.State)
	assert.Equal(t, 1, rec.Attempts, "the journal counts the attempt that was sent, not the replay Authorize stopped")
}

// Resume's send of a pending operation whose Authorize fails journals no
// attempt: the operation stays pending with none.
func TestAFailingAuthorizeOnResumeIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	auth := &failingAfter{}
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), Authorize: auth.authorize})
	ctx := context.Background()
	_, err := c.Begin(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
	require.NoError(t, err)

	rep, err := c.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Pending, "%+v", rep)
	assert.Empty(t, srv.received())
	rec, err := j.Lookup(ctx, "default", "order-1")
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, rec.State)
	assert.Zero(t, rec.Attempts, "nothing was sent, and the journal counts nothing")
	assert.Contains(t, rec.LastError, "Config.Authorize failed")
}

// What Authorize makes of a request is what is sent, run before the
// attempt is journaled: a credential it puts in the URL's query reaches
// the server on the attempt and on a replay, and never the journal.
func TestAuthorizeMayPutItsCredentialInTheQuery(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var keys []string
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		keys = append(keys, r.URL.Query().Get("api_key"))
		mu.Unlock()
		if n == 1 {
			dropConn(w) // unknown: the status check replays it
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	policy := fastRetry()
	policy.MaxAttempts = 1
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy, Authorize: func(r *http.Request) error {
		q := r.URL.Query()
		q.Set("api_key", "s3cret")
		r.URL.RawQuery = q.Encode()
		return nil
	}})
	res, err := c.Do(context.Background(), idem.Op{ID: "order-1", URL: "/orders?x=1", Body: []byte(`{}`)})
	require.NoError(t, err)
	assert.Equal(t, 2, res.Attempts)
	mu.Lock()
	assert.Equal(t, []string{"s3cret", "s3cret"}, keys)
	mu.Unlock()
	rec, err := j.Lookup(context.Background(), "default", "order-1")
	require.NoError(t, err)
	assert.NotContains(t, rec.URL, "s3cret")
}

// Authorize runs for requests the client sends, and only those: a Do of an
// operation already settled sends nothing, so it runs no Authorize (which
// may fetch a token over the network), and the requests it does see carry
// the operation's journaled key.
func TestAuthorizeRunsOnlyForRequestsThatAreSent(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	var mu sync.Mutex
	var keys []string
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), Authorize: func(r *http.Request) error {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		return nil
	}})
	ctx := context.Background()
	op := idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)}
	first, err := c.Do(ctx, op)
	require.NoError(t, err)
	for range 3 {
		again, err := c.Do(ctx, op)
		require.NoError(t, err)
		assert.True(t, again.Journaled, "answered from the journal")
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{first.Key}, keys, "one request sent, one Authorize, with the operation's key")
	assert.Len(t, srv.received(), 1)
}
