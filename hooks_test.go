package idem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
)

// hookLog records what the hooks saw, in order.
type hookLog struct {
	mu       sync.Mutex
	starts   []idem.Call
	ends     []idem.CallEnd
	endCalls []idem.Call
	attempts []idem.AttemptInfo
	checks   []idem.StatusCheckInfo
	// ctxOK counts hook calls whose context carried the value CallStart
	// put there: the call ran with CallStart's context.
	ctxOK, ctxCalls int
}

type hookCtxKey struct{}

func (l *hookLog) hooks() idem.Hooks {
	seen := func(ctx context.Context) {
		l.ctxCalls++
		if ctx.Value(hookCtxKey{}) != nil {
			l.ctxOK++
		}
	}
	return idem.Hooks{
		CallStart: func(ctx context.Context, c idem.Call) context.Context {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.starts = append(l.starts, c)
			return context.WithValue(ctx, hookCtxKey{}, c.ID)
		},
		CallEnd: func(ctx context.Context, c idem.Call, e idem.CallEnd) {
			l.mu.Lock()
			defer l.mu.Unlock()
			seen(ctx)
			l.endCalls, l.ends = append(l.endCalls, c), append(l.ends, e)
		},
		Attempt: func(ctx context.Context, a idem.AttemptInfo) {
			l.mu.Lock()
			defer l.mu.Unlock()
			seen(ctx)
			l.attempts = append(l.attempts, a)
		},
		StatusCheck: func(ctx context.Context, s idem.StatusCheckInfo) {
			l.mu.Lock()
			defer l.mu.Unlock()
			seen(ctx)
			l.checks = append(l.checks, s)
		},
		Propagate: func(ctx context.Context, h http.Header) {
			if id, ok := ctx.Value(hookCtxKey{}).(string); ok {
				h.Set("Traceparent", "trace-of-"+id)
			}
		},
		Link: func(ctx context.Context) string {
			if id, ok := ctx.Value(hookCtxKey{}).(string); ok {
				return "link-of-" + id
			}
			return ""
		},
	}
}

func TestHooksFollowAHappyCall(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var seen []http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	var log hookLog
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Hooks: log.hooks()})
	op := idem.Op{ID: "checkout/cart-1", URL: "/orders", Body: []byte(`{"n":1}`)}
	res, err := c.Do(t.Context(), op)
	require.NoError(t, err)

	require.Len(t, log.starts, 1)
	assert.Equal(t, idem.Call{Kind: idem.CallDo, Scope: "default", ID: "checkout/cart-1", Method: "POST", URL: srv.URL + "/orders"}, log.starts[0])
	require.Len(t, log.ends, 1)
	end := log.ends[0]
	assert.Equal(t, res.Key, end.Key)
	assert.Equal(t, idem.StateSucceeded, end.State)
	assert.NoError(t, end.Err)
	assert.Equal(t, 1, end.Attempts)
	assert.Zero(t, end.StatusChecks)
	assert.Equal(t, idem.SettledDirectly, end.Settled)
	assert.True(t, end.Replayed)
	assert.Equal(t, res.Key, log.endCalls[0].Key, "CallEnd's Call has the key")
	assert.Equal(t, "link-of-checkout/cart-1", log.endCalls[0].Link)

	require.Len(t, log.attempts, 1)
	a := log.attempts[0]
	assert.Equal(t, 1, a.Number)
	assert.True(t, a.Written)
	assert.Equal(t, http.StatusCreated, a.StatusCode)
	assert.True(t, a.Replayed)
	assert.Equal(t, idem.Succeeded, a.Decision.Verdict)
	assert.Zero(t, a.Wait)
	assert.NoError(t, a.Err)
	assert.False(t, a.End.Before(a.Start), "the attempt ends after it starts")
	assert.False(t, a.Start.IsZero())
	assert.Equal(t, res.Key, a.Key)
	assert.Equal(t, log.ctxCalls, log.ctxOK, "every hook got the context CallStart returned")

	// The propagated header went on the wire, and is neither journaled
	// nor part of the fingerprint.
	require.Len(t, seen, 1)
	assert.Equal(t, "trace-of-checkout/cart-1", seen[0].Get("Traceparent"))
	rec, err := j.Get(t.Context(), res.Key)
	require.NoError(t, err)
	assert.Empty(t, rec.Header.Get("Traceparent"), "not journaled")
	assert.Equal(t, idem.Fingerprint("POST", srv.URL+"/orders", nil, nil, op.Body), rec.Fingerprint, "not in the fingerprint")
	assert.Equal(t, "link-of-checkout/cart-1", rec.Link, "the link is journaled")
}

func TestHooksFollowALostResponseSettledByStatusCheck(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	var log hookLog
	c, _ := acceptanceClient(t, srv, func(cfg *idem.Config) { cfg.Hooks = log.hooks() })
	srv.Inject(testserver.DropAfterCommit)
	res, err := c.Do(t.Context(), orderOp("checkout/cart-lost", 1))
	require.NoError(t, err)
	assert.Equal(t, 1, srv.TotalOrders())

	require.Len(t, log.ends, 1)
	end := log.ends[0]
	assert.Equal(t, idem.StateSucceeded, end.State)
	assert.Equal(t, idem.SettledByStatusCheck, end.Settled)
	assert.Equal(t, 1, end.Attempts)
	assert.Equal(t, 1, end.StatusChecks)
	require.Len(t, log.attempts, 1)
	assert.Error(t, log.attempts[0].Err, "the connection was dropped")
	assert.True(t, log.attempts[0].Written)
	assert.Zero(t, log.attempts[0].StatusCode)
	assert.Equal(t, idem.Unknown, log.attempts[0].Decision.Verdict)
	require.Len(t, log.checks, 1)
	ck := log.checks[0]
	assert.Equal(t, 1, ck.Number)
	assert.Equal(t, idem.StatusCompleted, ck.State)
	assert.Equal(t, http.StatusCreated, ck.StatusCode)
	assert.NoError(t, ck.Err)
	assert.Equal(t, res.Key, ck.Key)
	assert.Equal(t, log.ctxCalls, log.ctxOK, "every hook got the context CallStart returned")
}

func TestHooksFollowARetryWithTheWaitAndARejection(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	var log hookLog
	c, _ := acceptanceClient(t, srv, func(cfg *idem.Config) { cfg.Hooks = log.hooks() })
	srv.Inject(testserver.ServerErrorBeforeCommit)
	_, err := c.Do(t.Context(), orderOp("checkout/cart-retry", 1))
	require.NoError(t, err)
	require.Len(t, log.attempts, 2)
	assert.Equal(t, http.StatusInternalServerError, log.attempts[0].StatusCode)
	assert.Positive(t, log.attempts[0].Wait, "the wait before the second attempt")
	assert.Equal(t, 2, log.attempts[1].Number)
	assert.Zero(t, log.attempts[1].Wait, "no attempt after the last")
	assert.Equal(t, 2, log.ends[0].Attempts)
	assert.Equal(t, idem.SettledByResend, log.ends[0].Settled,
		"a 500 after the request was written left the outcome unknown; the same key's re-send settled it")

	// A rejection ends the call with the error and the rejected state.
	_, err = c.Do(t.Context(), idem.Op{ID: "checkout/bad", URL: "/orders", Body: []byte(`not json`)})
	require.ErrorIs(t, err, idem.ErrRejected)
	end := log.ends[len(log.ends)-1]
	assert.Equal(t, idem.StateRejected, end.State)
	assert.ErrorIs(t, end.Err, idem.ErrRejected)
}

func TestHooksFollowResumeWithTheLinkAndTheTakeOver(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	path := filepath.Join(t.TempDir(), "ops.db")
	j := openJournal(t, path)
	// A worker that created an operation, sent it and died: its lease is
	// short and lapses.
	op := orderOp("checkout/cart-crashed", 1)
	dead, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Owner: "dead-worker",
		Hooks: idem.Hooks{Link: func(context.Context) string { return "00-link-of-the-first-call" }}})
	require.NoError(t, err)
	o, err := dead.Begin(t.Context(), op)
	require.NoError(t, err)
	require.NoError(t, dead.Close())
	rec, err := j.Get(t.Context(), o.Key())
	require.NoError(t, err)
	assert.Equal(t, "00-link-of-the-first-call", rec.Link, "Begin journals the link too")
	acquired, err := j.Acquire(t.Context(), o.Key(), "dead-worker#1", 30*time.Millisecond)
	require.NoError(t, err)
	next := acquired
	next.State = idem.StateInFlight
	next.Attempts = 1
	next.ExpiresAt = time.Now().Add(time.Hour)
	_, err = j.Update(t.Context(), next, idem.Durable, idem.Event{Kind: idem.EventSend})
	require.NoError(t, err)
	time.Sleep(60 * time.Millisecond)

	var log hookLog
	c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.StatusURL),
		Retry: fastRetry(), Hooks: log.hooks()})
	report, err := c.Resume(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 1, report.Succeeded)

	require.Len(t, log.starts, 1)
	start := log.starts[0]
	assert.Equal(t, idem.CallResume, start.Kind)
	assert.Equal(t, o.Key(), start.Key)
	assert.Equal(t, "00-link-of-the-first-call", start.Link, "Resume's call carries the journaled link")
	assert.Equal(t, "dead-worker#1", start.TakenFrom, "the lease was taken over")
	require.Len(t, log.ends, 1)
	assert.Equal(t, idem.StateSucceeded, log.ends[0].State)
	// The operation had been in_flight: the status check said the server
	// never saw the key, and the re-send settled it.
	assert.Equal(t, idem.SettledByResend, log.ends[0].Settled)
	require.NotEmpty(t, log.checks)
	assert.Equal(t, idem.StatusNotFound, log.checks[0].State)
}

func TestHooksLinkTooLongIsNotJournaled(t *testing.T) {
	t.Parallel()
	srv, _, _ := countingServer(t)
	long := string(make([]byte, idem.MaxLinkLength+1))
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Hooks: idem.Hooks{Link: func(context.Context) string { return long }}})
	res, err := c.Do(t.Context(), idem.Op{ID: "a", URL: "/x"})
	require.NoError(t, err, "a link too long is dropped, not an error")
	rec, err := j.Get(t.Context(), res.Key)
	require.NoError(t, err)
	assert.Empty(t, rec.Link)
}

func TestHooksTellTheCallThatExpiredAnOperation(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			http.Error(w, "down", http.StatusBadGateway)
			return
		}
		dropConn(w) // applied, answer lost
	})
	policy := fastRetry()
	policy.MaxStatusChecks = 1
	var log hookLog
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/status"),
		Retry: policy, Retention: time.Second, Hooks: log.hooks()})
	op := idem.Op{ID: "op", URL: "/orders"}
	_, err := c.Do(t.Context(), op)
	// A retention of a second, not a few milliseconds: on a loaded
	// machine the first call could outlive a shorter one.
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	time.Sleep(1100 * time.Millisecond) // past the server's retention
	_, err = c.Do(t.Context(), op)
	require.ErrorIs(t, err, idem.ErrNeedsReconciliation)
	_, err = c.Do(t.Context(), op)
	require.ErrorIs(t, err, idem.ErrNeedsReconciliation)

	require.Len(t, log.ends, 3)
	assert.False(t, log.ends[0].Expired, "left unknown")
	assert.Equal(t, idem.StateExpired, log.ends[1].State)
	assert.True(t, log.ends[1].Expired, "this call expired it")
	assert.Equal(t, idem.StateExpired, log.ends[2].State)
	assert.False(t, log.ends[2].Expired, "this call found it expired")
}

func TestHooksFollowSendFromTheStart(t *testing.T) {
	t.Parallel()
	srv, _, _ := countingServer(t)
	var log hookLog
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Hooks: log.hooks()})
	o, err := c.Begin(context.WithValue(t.Context(), hookCtxKey{}, "app"), idem.Op{ID: "checkout/begun", Method: "PUT", URL: "/orders/1"})
	require.NoError(t, err)
	_, err = o.Send(t.Context())
	require.NoError(t, err)
	require.Len(t, log.starts, 1)
	assert.Equal(t, idem.Call{Kind: idem.CallSend, Scope: "default", ID: "checkout/begun", Key: o.Key(),
		Method: "PUT", URL: srv.URL + "/orders/1", Link: "link-of-app"}, log.starts[0],
		"Send's call names the journaled request and link when it starts")
}
