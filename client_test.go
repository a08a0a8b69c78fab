package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// scripted answers request n (from 1) with script(n, r) and records every
// key it received.
type scripted struct {
	*httptest.Server
	mu   sync.Mutex
	keys []string
}

func newScripted(t *testing.T, script func(n int, w http.ResponseWriter, r *http.Request)) *scripted {
	t.Helper()
	s := &scripted{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.keys = append(s.keys, r.Header.Get("Idempotency-Key"))
		n := len(s.keys)
		s.mu.Unlock()
		script(n, w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// routeStatus sends srv's GET /status/{key} to its script too, with the
// key asked about in r.PathValue("key"): the server is its own status
// endpoint (idem.StatusEndpoint(srv.URL + "/status")).
func (s *scripted) routeStatus() {
	mux := http.NewServeMux()
	mux.Handle("GET /status/{key}", s.Config.Handler)
	mux.Handle("/", s.Config.Handler)
	s.Config.Handler = mux
}

// assertJournalHoldsNo asserts that neither j's file nor its WAL holds
// secret in clear. Close j first, so that nothing is left unwritten.
func assertJournalHoldsNo(t *testing.T, j *idem.SQLiteJournal, secret string) {
	t.Helper()
	for _, path := range []string{j.Path(), j.Path() + "-wal"} {
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		require.NoError(t, err)
		assert.NotContains(t, string(b), secret, "%s holds a secret in clear", path)
	}
}

func (s *scripted) received() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

func fastRetry() idem.RetryPolicy {
	return idem.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, MaxRetryAfter: 20 * time.Millisecond}
}

func TestRetryAfterIsHonouredWithTheSameKey(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.Header().Set("Retry-After", "1") // within MaxRetryAfter: the call waits
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	policy := fastRetry()
	policy.MaxRetryAfter = 5 * time.Second
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy})
	start := time.Now()
	res, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders"})
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, res.State)
	keys := srv.received()
	require.Len(t, keys, 2)
	assert.Equal(t, res.Key, keys[0])
	assert.Equal(t, keys[0], keys[1], "a retry carries the same key")
	assert.Equal(t, 2, res.Attempts)
	assert.GreaterOrEqual(t, time.Since(start), time.Second, "the retry waited for the server's Retry-After")
}

func TestNoWaitRunsPastTheContextDeadline(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "60")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	policy := fastRetry()
	policy.MaxRetryAfter = time.Minute
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy, Status: idem.StatusEndpoint(srv.URL + "/status")})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Do(ctx, idem.Op{ID: "a", URL: "/orders"})
	require.Error(t, err)
	assert.NoError(t, ctx.Err(), "Do must return before the deadline instead of sleeping into it")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "a 503 may have been applied")
	assert.Contains(t, err.Error(), "after the context's deadline")
	assert.Len(t, srv.received(), 1, "the second attempt would have started after the deadline")
}

func TestServerDownLeavesTheOperationPending(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there now: every dial is refused
	c, j := newClient(t, idem.Config{BaseURL: url, Retry: fastRetry()})
	_, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders"})
	require.ErrorIs(t, err, idem.ErrNotSent)
	var oe *idem.OperationError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, idem.StatePending, oe.State)
	assert.Equal(t, 5, oe.Attempts)
	rec, err := j.Lookup(context.Background(), "default", "a")
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, rec.State)
	assert.True(t, rec.ExpiresAt.IsZero(), "nothing reached the server: no retention clock runs")
	assert.Contains(t, rec.LastError, "refused")
}

func TestRetryBudgetStopsARetryStorm(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	})
	policy := fastRetry()
	policy.MinRetriesPerSecond = 0.5 // a bucket of 5 tokens, refilled slowly
	policy.RetryRatio = 0.01
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy, Status: idem.StatusEndpoint(srv.URL + "/status")})
	exhausted := 0
	const ops = 20
	for i := range ops {
		_, err := c.Do(context.Background(), idem.Op{ID: fmt.Sprint("op-", i), URL: "/orders"})
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		if errors.Is(err, idem.ErrRetryBudgetExhausted) {
			exhausted++
		}
	}
	// Without a budget: 20 operations x 5 attempts. With it: 20 first
	// attempts and about 5 retries.
	assert.Less(t, len(srv.received()), ops+15)
	assert.Greater(t, exhausted, ops/2)
}

// Secrets: a token added by Authorize reaches the server on every attempt
// and status check, and never the journal file nor the logs.
func TestAuthorizeTokensNeverReachTheJournalOrLogs(t *testing.T) {
	t.Parallel()
	const token = "tok_9f8e7d6c5b4a39281706"
	const marker = "card-number-4242424242424242"
	var authorized, unauthorized atomic.Int32
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			unauthorized.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		authorized.Add(1)
		switch {
		case r.Method == http.MethodGet: // the status endpoint
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"key":%q,"state":"not_found"}`, r.PathValue("key"))
		case n == 1: // the first attempt's answer is lost after it was written
			// Cutting the connection, not outlasting AttemptTimeout: a
			// timeout also bounds the status check and the resend, which a
			// loaded machine can make outlast it too.
			dropConn(w)
		default:
			w.Header().Set("Set-Cookie", "session="+token)
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"id":"ord_1"}`)
		}
	})
	mux := http.NewServeMux()
	mux.Handle("/", srv.Config.Handler)
	srv.Config.Handler = mux
	var logs bytes.Buffer
	var calls atomic.Int32
	c, j := newClient(t, idem.Config{
		BaseURL: srv.URL,
		Status:  idem.StatusEndpoint(srv.URL + "/status"),
		Retry:   fastRetry(),
		Logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Authorize: func(r *http.Request) error {
			calls.Add(1)
			r.Header.Set("Authorization", "Bearer "+token)
			return nil
		},
	})
	res, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders", Body: []byte(marker)})
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, res.StatusCode)
	assert.Zero(t, unauthorized.Load())
	assert.Equal(t, int32(3), authorized.Load(), "attempt, status check, resend")
	assert.Equal(t, int32(3), calls.Load(), "Authorize runs on every attempt and status check")
	assert.Empty(t, res.Header.Values("Set-Cookie"), "Set-Cookie is never journaled")
	require.NoError(t, j.Close())

	assertJournalHoldsNo(t, j, token)
	assert.NotEmpty(t, logs.String())
	assert.NotContains(t, logs.String(), token)
	assert.NotContains(t, logs.String(), marker, "logs carry no bodies")
}

func TestCancelWithdrawsOnlyAPendingOperation(t *testing.T) {
	t.Parallel()
	srv, hits, _ := countingServer(t)
	c, j := newClient(t, idem.Config{BaseURL: srv.URL})
	ctx := context.Background()
	op, err := c.Begin(ctx, idem.Op{ID: "refund/1", URL: "/refunds"})
	require.NoError(t, err)
	require.NoError(t, c.Cancel(ctx, op.Key()))
	_, err = op.Send(ctx)
	require.ErrorIs(t, err, idem.ErrCanceled)
	_, err = c.Do(ctx, idem.Op{ID: "refund/1", URL: "/refunds"})
	require.ErrorIs(t, err, idem.ErrCanceled)
	assert.Zero(t, hits.Load(), "a canceled operation is never sent")

	res, err := c.Do(ctx, idem.Op{ID: "refund/2", URL: "/refunds"})
	require.NoError(t, err)
	err = c.Cancel(ctx, res.Key)
	require.ErrorIs(t, err, idem.ErrIllegalTransition)
	assert.Contains(t, err.Error(), "only a pending operation")
	rec, err := j.Get(ctx, res.Key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State, "a refused Cancel changes nothing")
	assert.ErrorIs(t, c.Cancel(ctx, "no-such-key"), idem.ErrNotFound)
}

func TestOnTransitionSeesEveryStateChange(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	var mu sync.Mutex
	var seen []string
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), OnTransition: func(tr idem.Transition) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%s→%s %d", tr.From, tr.To, tr.StatusCode))
	}})
	_, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/"})
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"none→in_flight 0", "in_flight→succeeded 201"}, seen,
		"a retry within in_flight is journaled but is not a state change")
}

func TestClassifierCanBeReplaced(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.WriteHeader(http.StatusNotFound) // this API answers 404 while a resource replicates
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), Classify: func(a idem.Attempt) idem.Decision {
		if a.Response != nil && a.Response.StatusCode == http.StatusNotFound {
			return idem.Decision{Verdict: idem.Retry, Reason: "not replicated yet"}
		}
		return idem.Classify(a)
	}})
	res, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/"})
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, res.StatusCode)
	assert.Len(t, srv.received(), 2)
}

func TestReconcileAndCancelRespectALiveLease(t *testing.T) {
	t.Parallel()
	c, j := newClient(t, idem.Config{})
	ctx := context.Background()
	rec := testRecord("default", "op", nil)
	rec.State = idem.StateInFlight
	rec.Lease = idem.Lease{Owner: "worker-1", ExpiresAt: time.Now().Add(time.Hour)}
	rec, _, err := j.Create(ctx, rec)
	require.NoError(t, err)
	rec.State = idem.StateUnknown
	rec, err = j.Update(ctx, rec, idem.Durable, idem.Event{}) // the holder's own write
	require.NoError(t, err)

	err = c.Reconcile(ctx, rec.Key, idem.StateSucceeded, "found it")
	require.ErrorIs(t, err, idem.ErrLeased, "a worker is driving it")
	got, err := j.Get(ctx, rec.Key)
	require.NoError(t, err)
	assert.Equal(t, rec, got, "nothing changed")

	pending, _, err := j.Create(ctx, idem.Record{Key: "k2", Scope: "default", ID: "op2", Method: "POST",
		URL: "http://127.0.0.1/x", Fingerprint: "f", KeyHeader: "Idempotency-Key", State: idem.StatePending})
	require.NoError(t, err)
	_, err = j.Acquire(ctx, pending.Key, "worker-1", time.Hour)
	require.NoError(t, err)
	require.ErrorIs(t, c.Cancel(ctx, pending.Key), idem.ErrLeased)
}

func TestReconcileRefusesInFlight(t *testing.T) {
	t.Parallel()
	c, j := newClient(t, idem.Config{})
	rec := testRecord("default", "op", nil)
	rec.State = idem.StateInFlight
	rec, _, err := j.Create(context.Background(), rec)
	require.NoError(t, err)
	err = c.Reconcile(context.Background(), rec.Key, idem.StateSucceeded, "guess")
	require.ErrorIs(t, err, idem.ErrIllegalTransition)
	assert.Contains(t, err.Error(), "only unknown or expired")
}

// A client resumes only the operations meant for its own API: its
// credentials never go to another origin.
func TestResumeClaimsOnlyItsOrigin(t *testing.T) {
	t.Parallel()
	ours, ourHits, _ := countingServer(t)
	theirs, theirHits, _ := countingServer(t)
	j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
	ctx := context.Background()
	for _, base := range []string{ours.URL, theirs.URL} {
		c, err := idem.New(idem.Config{Journal: j, BaseURL: base})
		require.NoError(t, err)
		_, err = c.Begin(ctx, idem.Op{ID: "op-for-" + base, URL: "/x"})
		require.NoError(t, err)
		require.NoError(t, c.Close())
	}
	c, err := idem.New(idem.Config{Journal: j, BaseURL: ours.URL, Authorize: func(r *http.Request) error {
		r.Header.Set("Authorization", "Bearer ours")
		return nil
	}})
	require.NoError(t, err)
	defer c.Close()
	rep, err := c.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Claimed)
	assert.Equal(t, 1, rep.Succeeded)
	assert.Equal(t, int32(1), ourHits.Load())
	assert.Zero(t, theirHits.Load(), "another API's operation must not be claimed")
	rec, err := j.Lookup(ctx, "default", "op-for-"+theirs.URL)
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, rec.State)
}

// An operation interrupted by its caller (or by Close) is due again at once,
// so that a process that restarts right away resumes it; one that failed
// on the server's side waits a backoff, so that Resume does not spin.
func TestInterruptedOperationIsDueAtOnce(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	defer close(release)
	policy := fastRetry()
	policy.MaxBackoff = time.Hour
	policy.MaxAttempts = 1
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy, Status: idem.StatusEndpoint(srv.URL + "/status")})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		require.Eventually(t, func() bool { return len(srv.received()) == 1 }, 5*time.Second, time.Millisecond)
		cancel()
	}()
	_, err := c.Do(ctx, idem.Op{ID: "interrupted", URL: "/slow"})
	require.ErrorIs(t, err, context.Canceled)
	rec, err := j.Lookup(context.Background(), "default", "interrupted")
	require.NoError(t, err)
	assert.False(t, rec.NextAttemptAt.After(time.Now()), "due at once")

	_, err = c.Do(context.Background(), idem.Op{ID: "failed", URL: "/fast"})
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	rec, err = j.Lookup(context.Background(), "default", "failed")
	require.NoError(t, err)
	assert.True(t, rec.NextAttemptAt.After(time.Now().Add(30*time.Minute)), "due after MaxBackoff")
}

// A server that does not keep keys executes a replay again. The client sees
// it when it has the beginning of the first answer (the body broke off) and
// the replay answers otherwise: it stops, sends nothing more, and parks the
// operation for an operator.
func TestServerThatIgnoresKeysIsDetected(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		body := fmt.Sprintf(`{"order_id":"ord_%d","status":"created"}`, n)
		if n == 1 {
			// The answer breaks off after the status line, the headers
			// and half the body.
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(body[:len(body)/2]))
			w.(http.Flusher).Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.(*net.TCPConn).SetLinger(0)
				_ = conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, body) // a new order each time: keys are ignored
	})
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()}) // ReplayStatus, the default
	ctx := context.Background()
	_, err := c.Do(ctx, idem.Op{ID: "checkout/cart-9", URL: "/orders"})
	require.ErrorIs(t, err, idem.ErrKeyNotHonoured)
	require.ErrorIs(t, err, idem.ErrNeedsReconciliation)
	assert.Contains(t, err.Error(), "check for a duplicate")
	assert.Len(t, srv.received(), 2, "the attempt and one replay; nothing more")
	rec, err := j.Lookup(ctx, "default", "checkout/cart-9")
	require.NoError(t, err)
	assert.Equal(t, idem.StateExpired, rec.State)
	assert.Contains(t, rec.LastError, "does not honour idempotency keys")

	_, err = c.Do(ctx, idem.Op{ID: "checkout/cart-9", URL: "/orders"})
	require.ErrorIs(t, err, idem.ErrNeedsReconciliation)
	assert.Len(t, srv.received(), 2, "a parked operation is never re-sent")
}

// A success is committed before Do returns, so that an exit without Close
// loses nothing Do reported; a rejection is on disk before Do returns too,
// since a server need not keep a request it refused.
func TestOutcomeDurability(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/refused" {
			http.Error(w, `{"error":"card declined"}`, http.StatusPaymentRequired)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	path := filepath.Join(t.TempDir(), "ops.db")
	j, err := idem.OpenSQLite(path, idem.SQLiteLingerDelay(time.Hour))
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()

	res, err := c.Do(ctx, idem.Op{ID: "pay-1", URL: "/refused", Body: []byte(`{}`)})
	require.ErrorIs(t, err, idem.ErrRejected, "a rejection is a definitive answer, and an error")
	require.Equal(t, idem.StateRejected, res.State)
	assert.Equal(t, idem.StateRejected, rawState(t, path, res.Key), "the rejection was committed before Do returned")

	res, err = c.Do(ctx, idem.Op{ID: "pay-2", URL: "/ok", Body: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, idem.StateSucceeded, res.State)
	assert.Equal(t, idem.StateSucceeded, rawState(t, path, res.Key),
		"a success is committed before Do returns: another process reading the file sees it")
}

func TestResultSaysWhenTheAnswerCameFromTheJournal(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"order":1}`))
	})
	c, err := idem.New(idem.Config{Journal: idem.NewMemoryJournal(), BaseURL: srv.URL})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	op := idem.Op{ID: "tool-call-1", URL: "/orders", Body: []byte(`{}`)}

	first, err := c.Do(ctx, op)
	require.NoError(t, err)
	assert.False(t, first.Journaled, "the first call sent the request")
	again, err := c.Do(ctx, op)
	require.NoError(t, err)
	assert.True(t, again.Journaled, "the second call answered from the journal")
	assert.Equal(t, first.Body, again.Body)
	o, err := c.Begin(ctx, op)
	require.NoError(t, err)
	sent, err := o.Send(ctx)
	require.NoError(t, err)
	assert.True(t, sent.Journaled, "Send of a settled operation answers from the journal")
	assert.Len(t, srv.received(), 1, "one request in all")
}

func TestResumeIntervalFinishesWhatACallLeft(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	j := idem.NewMemoryJournal()
	retry := fastRetry()
	retry.MaxAttempts = 1
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Retry: retry, ResumeInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = c.Do(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
	require.Error(t, err, "the only attempt got a 503")
	require.Eventually(t, func() bool {
		rec, err := c.Lookup(ctx, "", "order-1")
		return err == nil && rec.State == idem.StateSucceeded
	}, 10*time.Second, 5*time.Millisecond, "the background resume sends it again, without the application calling Resume")
	keys := srv.received()
	require.Len(t, keys, 2)
	assert.Equal(t, keys[0], keys[1], "with the same key")
	require.NoError(t, c.Close(), "Close stops the background resume (goleak checks it is gone)")
}

// oneAttempt returns a client that makes one attempt, bounded by
// attemptTimeout, at a server that answers it with orders and every status
// check with 503: an answer that orders keeps from the client leaves the
// operation unknown.
func oneAttempt(t *testing.T, attemptTimeout time.Duration, orders http.HandlerFunc) (*idem.Client, *idem.SQLiteJournal) {
	t.Helper()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/status" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		orders(w, r)
	})
	policy := fastRetry()
	policy.MaxAttempts = 1
	return newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy, AttemptTimeout: attemptTimeout,
		Status: idem.StatusEndpoint(srv.URL + "/status")})
}

// An answer whose body stops coming is cut off by AttemptTimeout like one
// that never starts, and the error says which bound cut it.
func TestAttemptTimeoutCutsAStalledBody(t *testing.T) {
	t.Parallel()
	c, j := oneAttempt(t, 200*time.Millisecond, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":`))
		http.NewResponseController(w).Flush()
		<-r.Context().Done() // the rest never comes
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := c.Do(ctx, idem.Op{ID: "stalled", URL: "/orders"})
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the answer had begun: the server may have acted")
	require.NoError(t, ctx.Err(), "the stalled body must not hold the call until the caller's deadline")
	rec, err := j.Lookup(context.Background(), "default", "stalled")
	require.NoError(t, err)
	assert.Contains(t, rec.LastError, "AttemptTimeout, 200ms")
}

// A caller's deadline that comes before AttemptTimeout is the attempt's
// bound (the transport gives it no bound of its own then): it cuts a body
// that stops coming, and the error is the caller's deadline, not
// AttemptTimeout.
func TestACallersEarlierDeadlineCutsAStalledBodyAsTheCallers(t *testing.T) {
	t.Parallel()
	c, j := oneAttempt(t, time.Hour, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":`))
		http.NewResponseController(w).Flush()
		<-r.Context().Done() // the rest never comes
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Do(ctx, idem.Op{ID: "stalled", URL: "/orders"})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	rec, err := j.Lookup(context.Background(), "default", "stalled")
	require.NoError(t, err)
	assert.Equal(t, idem.StateUnknown, rec.State, "the answer had begun: the server may have acted")
	assert.Contains(t, rec.LastError, "deadline exceeded")
	assert.NotContains(t, rec.LastError, "AttemptTimeout")
}

// Resume claims operations ahead of its drivers; one waiting for a driver
// keeps its lease, renewed like the driven ones, so that another worker
// does not take it over however long the operations before it take.
func TestResumeHoldsTheLeasesOfWhatItClaimedAhead(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	arrived := make(chan struct{}, 2)
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		time.Sleep(3 * lease) // three lease periods for the one claimed ahead to wait
		w.WriteHeader(http.StatusCreated)
	})
	j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
	ctx := context.Background()
	enqueue, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL})
	require.NoError(t, err)
	for _, id := range []string{"first", "second"} {
		_, err = enqueue.Begin(ctx, idem.Op{ID: id, URL: "/orders"})
		require.NoError(t, err)
	}
	require.NoError(t, enqueue.Close())

	a, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Owner: "a", LeaseDuration: lease,
		ResumeConcurrency: 1})
	done := make(chan idem.ResumeReport, 1)
	go func() {
		rep, err := a.Resume(ctx)
		assert.NoError(t, err)
		done <- rep
	}()
	<-arrived // a drives one, and has claimed the other ahead
	time.Sleep(2 * lease)

	b, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Owner: "b", LeaseDuration: lease})
	rep, err := b.Resume(ctx)
	require.NoError(t, err)
	assert.Zero(t, rep.Claimed, "both operations are a's: one driven, one waiting with its lease renewed")
	assert.Equal(t, 2, rep.Leased)

	repA := <-done
	assert.Equal(t, 2, repA.Claimed)
	assert.Equal(t, 2, repA.Succeeded)
	assert.Len(t, srv.received(), 2, "each sent once")
	for _, id := range []string{"first", "second"} {
		rec, err := j.Lookup(ctx, "default", id)
		require.NoError(t, err)
		assert.Equal(t, idem.StateSucceeded, rec.State)
		events, err := j.History(ctx, rec.Key)
		require.NoError(t, err)
		for _, ev := range events {
			assert.NotContains(t, ev.Owner, "b#", "%s: b took it over", id)
		}
	}
}

// A connection closed without an answer is not a timeout, though the
// attempt's bound is lifted as the error comes back.
func TestDroppedConnectionIsNotATimeout(t *testing.T) {
	t.Parallel()
	c, j := oneAttempt(t, time.Minute, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		_ = conn.Close()
	})
	_, err := c.Do(context.Background(), idem.Op{ID: "dropped", URL: "/orders"})
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	rec, err := j.Lookup(context.Background(), "default", "dropped")
	require.NoError(t, err)
	assert.NotContains(t, rec.LastError, "AttemptTimeout")
	events, err := j.History(context.Background(), rec.Key)
	require.NoError(t, err)
	for _, ev := range events {
		assert.NotContains(t, ev.Error, "AttemptTimeout")
		assert.NotContains(t, ev.Detail, "AttemptTimeout")
	}
}

// The answer to a HEAD has a Content-Length and no body: the client reads
// the body by its Content-Length, and an empty one is no error.
func TestAHeadAnswerWithContentLengthAndNoBodySucceeds(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5")
		w.WriteHeader(http.StatusOK)
	})
	c, _ := newClient(t, idem.Config{Journal: idem.NewMemoryJournal(), BaseURL: srv.URL})
	res, err := c.Do(context.Background(), idem.Op{ID: "head", Method: http.MethodHead, URL: "/orders/1"})
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.Empty(t, res.Body)
}
