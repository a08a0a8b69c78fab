package server_test

// The tests of what runs once: a handler that ran is never run again for
// its key because something failed after it ran (issue 11).

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/server"
)

// TestStoreFailureAfterTheHandlerKeepsTheKey: the handler ran, and storing
// its response fails. The key stays held (its heartbeat keeps running), the
// client is told "in progress" (409, Retry-After), never "not applied", and
// the middleware retries storing until it succeeds; from then on the replay
// and the status endpoint give the stored answer. The handler runs once.
func TestStoreFailureAfterTheHandlerKeepsTheKey(t *testing.T) {
	t.Parallel()
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := &faultyStore{Store: newStore(t)}
			store.failCompletes.Store(true)
			// A short lock, so that the heartbeat renews it soon after the
			// clock jumps; not shorter than 300 ms, which bounds each claim
			// too: at 90 ms the replay's claim on the SQLite store missed
			// its bound once in the module's -race run beside the others
			// (a 503 instead of the replay).
			e := newEnv(t, created, withStore(store), func(c *server.Config) { c.LockTimeout = 300 * time.Millisecond })

			first := e.post("/orders", "k", `{"n":1}`)
			require.Equal(t, http.StatusConflict, first.Status, "a response that could not be stored is not sent: %s", first.Body)
			assert.Equal(t, wire.ProblemInProgress, first.problem(t).Type, "an idem client reads it as: wait, then check status")
			assert.Equal(t, "1", first.Header.Get("Retry-After"))
			assert.NotContains(t, first.Body, "echo")

			// The clock jumps past the lock timeout: the heartbeat, still
			// running while the response waits to be stored, renews the lock
			// at the new time, so nobody takes the key over.
			e.clock.Advance(time.Hour)
			moved := e.clock.Now()
			require.Eventually(t, func() bool {
				en, err := store.Get(context.Background(), "", "k", moved)
				return err == nil && en.LockedAt.Equal(moved)
			}, timeout, tick, "the heartbeat keeps the key held while storing is pending")

			s, _, _ := e.status("k")
			assert.Equal(t, wire.StateProcessing, s.State, "the status endpoint says processing while storing is pending")
			retry := e.post("/orders", "k", `{"n":1}`)
			assert.Equal(t, http.StatusConflict, retry.Status, "the client's retry does not run the handler again")
			require.Eventually(t, func() bool { return len(store.completeResults()) >= 3 }, timeout, tick,
				"the middleware keeps trying to store the response")

			store.failCompletes.Store(false) // the store recovers
			require.Eventually(t, func() bool {
				s, _, _ := e.status("k")
				return s.State == wire.StateCompleted
			}, timeout, tick, "the response is stored once the store works again")
			s, body, _ := e.status("k")
			assert.Equal(t, http.StatusCreated, s.Response.Status)
			assert.Equal(t, `{"echo":{"n":1}}`, string(body))
			replay := e.post("/orders", "k", `{"n":1}`)
			assert.Equal(t, http.StatusCreated, replay.Status)
			assert.True(t, replay.replayed())
			assert.Equal(t, `{"echo":{"n":1}}`, replay.Body, "the replay is the response of the one run")
			assert.EqualValues(t, 1, e.calls.Load(), "the handler ran once")
		})
	}
}

// TestCloseStopsStoringAndTheStaleKeyRunsAgain: Close stops the
// background storing of a response and waits for it (goleak checks that
// nothing is left). The key is then as a process that died left it: in
// progress until its lock goes stale, after which the next request runs the
// handler again; that run is what the application's own guard (see
// KeyFromContext) is for.
func TestCloseStopsStoringAndTheStaleKeyRunsAgain(t *testing.T) {
	t.Parallel()
	store := &faultyStore{Store: openSQLite(t)}
	store.failCompletes.Store(true)
	clk := newClock()
	mw, err := server.New(server.WithClock(server.Config{Store: store, Scope: server.SingleTenant, LockTimeout: time.Minute}, clk.Now))
	require.NoError(t, err)
	var calls atomic.Int64
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1); created(w, r) }))
	post := func(h http.Handler) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/orders", nil)
		req.Header.Set("Idempotency-Key", "k")
		h.ServeHTTP(rec, req)
		return rec
	}
	require.Equal(t, http.StatusConflict, post(h).Code)
	require.Eventually(t, func() bool { return len(store.completeResults()) >= 2 }, timeout, tick)
	require.NoError(t, mw.Close(), "Close stops the retrying and waits for it")
	en, err := store.Get(context.Background(), "", "k", clk.Now())
	require.NoError(t, err)
	assert.Equal(t, server.InProgress, en.State, "the key is still held, as a process that died would leave it")

	// A new middleware on the same store, as after a restart.
	store.failCompletes.Store(false)
	again, err := server.New(server.WithClock(server.Config{Store: store, Scope: server.SingleTenant, LockTimeout: time.Minute}, clk.Now))
	require.NoError(t, err)
	defer again.Close()
	h = again.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1); created(w, r) }))
	assert.Equal(t, http.StatusConflict, post(h).Code, "a fresh lock is not taken over")
	clk.Advance(time.Minute + time.Second)
	assert.Equal(t, http.StatusCreated, post(h).Code, "once the lock is stale the next request runs the handler again")
	assert.EqualValues(t, 2, calls.Load())
}

// TestFailingRenewalsCancelTheHandlerBeforeATakeOver: when this process
// cannot renew its lock, another request may take the key over once the
// lock is stale. Before that can happen, the handler's context is canceled
// with a cause the application can read, so that it stops instead of
// running alongside the taker; the take-over changes the fencing token, and
// the first run's late Complete is refused.
func TestFailingRenewalsCancelTheHandlerBeforeATakeOver(t *testing.T) {
	t.Parallel()
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := &faultyStore{Store: newStore(t)}
			causes := make(chan error, 1)
			g := newGate()
			e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-Attempt") != "first" {
					_, _ = w.Write([]byte("taker's answer"))
					return
				}
				store.failRenewals.Store(true) // the store is unreachable from here on
				select {
				case <-r.Context().Done():
					causes <- context.Cause(r.Context())
				case <-time.After(timeout):
					causes <- errors.New("the handler's context was never canceled")
				}
				g.wait() // it takes a moment to stop
				_, _ = w.Write([]byte("late answer"))
			}, withStore(store), func(c *server.Config) { c.LockTimeout = 90 * time.Millisecond })
			t.Cleanup(g.release) // before the server closes, should the test fail early

			firstDone := make(chan reply, 1)
			go func() {
				r, err := e.send(context.Background(), http.MethodPost, "/orders", "{}", "Idempotency-Key", "k", "X-Attempt", "first")
				assert.NoError(t, err)
				firstDone <- r
			}()
			cause := <-causes
			require.ErrorIs(t, cause, server.ErrLockNotRenewed, "the handler learns why it must stop")
			g.waitEntered(t)

			// Nobody renewed the lock: once it is stale, the next request
			// takes the key over with a new token.
			e.clock.Advance(time.Hour)
			taker := e.post("/orders", "k", "{}")
			assert.Equal(t, http.StatusOK, taker.Status)
			assert.Equal(t, "taker's answer", taker.Body)
			store.failRenewals.Store(false)

			g.release()
			late := <-firstDone
			assert.Equal(t, http.StatusConflict, late.Status, "the first run's answer is neither stored nor sent")
			results := store.completeResults()
			require.Len(t, results, 2)
			assert.NoError(t, results[0], "the taker stored its answer")
			assert.ErrorIs(t, results[1], server.ErrLockLost, "the first run's Complete was fenced off")
			replay := e.post("/orders", "k", "{}")
			assert.True(t, replay.replayed())
			assert.Equal(t, "taker's answer", replay.Body)
			assert.EqualValues(t, 2, e.calls.Load())
		})
	}
}

// panicking serves h behind the middleware of e's store, with a recoverer
// in front that records the panic and answers 500 itself, as a service's
// recovery middleware would.
func panicking(t *testing.T, store server.Store, policy server.StorePolicy, h http.HandlerFunc) (*env, <-chan any) {
	t.Helper()
	mw, err := server.New(server.Config{Store: store, Scope: server.SingleTenant, StorePolicy: policy})
	require.NoError(t, err)
	recovered := make(chan any, 10)
	inner := mw.Handler(h)
	mux := http.NewServeMux()
	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				recovered <- p
				w.WriteHeader(http.StatusInternalServerError)
			}
		}()
		inner.ServeHTTP(w, r)
	}))
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		srv.Close()
		assert.NoError(t, mw.Close())
	})
	return &env{t: t, srv: srv, mw: mw, store: store}, recovered
}

// TestHandlerPanicStoresA500AndPanicsOn: a handler that panicked may have
// acted before it did, so by default its key is not released for another
// run: a 500 problem is stored for it, and the panic goes on.
func TestHandlerPanicStoresA500AndPanicsOn(t *testing.T) {
	t.Parallel()
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int64
			e, recovered := panicking(t, newStore(t), server.StoreAll, func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				panic("handler bug")
			})
			r := e.post("/orders", "k", "{}")
			assert.Equal(t, http.StatusInternalServerError, r.Status)
			assert.Equal(t, "handler bug", <-recovered, "the panic goes on past the middleware")

			s, body, _ := e.status("k")
			require.Equal(t, wire.StateCompleted, s.State, "the key holds the failure")
			assert.Equal(t, http.StatusInternalServerError, s.Response.Status)
			p, ok := wire.ParseProblem(s.Response.Header.Get("Content-Type"), body)
			require.True(t, ok, "the stored answer is a problem: %s", body)
			assert.Equal(t, server.ProblemHandlerPanicked, p.Type)
			assert.Equal(t, "k", p.Key)

			retry := e.post("/orders", "k", "{}")
			assert.Equal(t, http.StatusInternalServerError, retry.Status)
			assert.True(t, retry.replayed(), "a retry gets the stored failure")
			assert.Equal(t, wire.ProblemContentType, retry.Header.Get("Content-Type"))
			assert.EqualValues(t, 1, calls.Load(), "the handler that panicked is not run again")
		})
	}
}

// TestHandlerPanicWhileTheStoreFailsKeepsTheKey: the stored failure of a
// panic goes through the same retrying as any response.
func TestHandlerPanicWhileTheStoreFailsKeepsTheKey(t *testing.T) {
	t.Parallel()
	store := &faultyStore{Store: server.NewMemoryStore()}
	store.failCompletes.Store(true)
	var calls atomic.Int64
	e, recovered := panicking(t, store, server.StoreAll, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		panic("handler bug")
	})
	e.post("/orders", "k", "{}")
	assert.Equal(t, "handler bug", <-recovered)
	s, _, _ := e.status("k")
	assert.Equal(t, wire.StateProcessing, s.State)
	assert.Equal(t, http.StatusConflict, e.post("/orders", "k", "{}").Status)
	store.failCompletes.Store(false)
	require.Eventually(t, func() bool {
		s, _, _ := e.status("k")
		return s.State == wire.StateCompleted && s.Response.Status == http.StatusInternalServerError
	}, timeout, tick)
	assert.EqualValues(t, 1, calls.Load())
}

// TestSkipServerErrorsReleasesAfterAPanic: releasing after a panic is what
// the application opts into with SkipServerErrors, for handlers whose
// failure undoes everything they did.
func TestSkipServerErrorsReleasesAfterAPanic(t *testing.T) {
	t.Parallel()
	store := server.NewMemoryStore()
	var calls atomic.Int64
	e, recovered := panicking(t, store, server.SkipServerErrors, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			panic("handler bug")
		}
		created(w, r)
	})
	r := e.post("/orders", "k", "{}")
	assert.Equal(t, http.StatusInternalServerError, r.Status)
	assert.Equal(t, "handler bug", <-recovered)
	assert.Zero(t, store.Len(), "the entry is released")
	r = e.post("/orders", "k", "{}")
	assert.Equal(t, http.StatusCreated, r.Status, "a retry runs the handler again")
	assert.False(t, r.replayed())
	assert.EqualValues(t, 2, calls.Load())
}

// TestInterruptedHandlerIsRunAgainOnceItsLockIsStale: a handler told to
// stop (its lock could not be renewed) that answers 5xx was interrupted by
// the middleware, not failed on its own: its answer is not stored, as if
// its process had died, and once the lock is stale the next request runs
// the handler again (the application's guard answers it). A handler that
// still answered below 500 finished: its answer is stored.
func TestInterruptedHandlerIsRunAgainOnceItsLockIsStale(t *testing.T) {
	t.Parallel()
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := &faultyStore{Store: newStore(t)}
			e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-Attempt") != "first" {
					created(w, r)
					return
				}
				store.failRenewals.Store(true)
				select {
				case <-r.Context().Done():
				case <-time.After(timeout):
				}
				// The application rolls back and fails, as the orders
				// example does when its transaction's context ends.
				http.Error(w, "could not be saved", http.StatusInternalServerError)
			}, withStore(store), func(c *server.Config) { c.LockTimeout = 90 * time.Millisecond })

			first := e.post("/orders", "k", `{"n":1}`, "X-Attempt", "first")
			assert.Equal(t, http.StatusConflict, first.Status, "the interrupted run's 500 is not the key's outcome: %s", first.Body)
			assert.Equal(t, wire.ProblemInProgress, first.problem(t).Type)
			store.failRenewals.Store(false)
			s, _, _ := e.status("k")
			assert.Equal(t, wire.StateProcessing, s.State, "until its lock is stale")

			e.clock.Advance(time.Hour)
			s, _, _ = e.status("k")
			assert.Equal(t, wire.StateNotFound, s.State, "the interrupted run no longer renews its lock")
			again := e.post("/orders", "k", `{"n":1}`)
			assert.Equal(t, http.StatusCreated, again.Status)
			assert.True(t, e.post("/orders", "k", `{"n":1}`).replayed())
			assert.EqualValues(t, 2, e.calls.Load())
		})
	}
}

func TestHandlerToldToStopThatStillSucceededIsStored(t *testing.T) {
	t.Parallel()
	store := &faultyStore{Store: server.NewMemoryStore()}
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		store.failRenewals.Store(true)
		<-r.Context().Done()
		store.failRenewals.Store(false)
		created(w, r) // it had committed before it looked
	}, withStore(store), func(c *server.Config) { c.LockTimeout = 90 * time.Millisecond })
	first := e.post("/orders", "k", `{"n":1}`)
	assert.Equal(t, http.StatusCreated, first.Status)
	replay := e.post("/orders", "k", `{"n":1}`)
	assert.True(t, replay.replayed(), "a success is the key's outcome, told to stop or not")
	assert.EqualValues(t, 1, e.calls.Load())
}

// TestALostCompletionReplyIsStoredOnce: a Complete that stored the
// response but whose reply was lost is sent again; the store recognises
// its own completion (same token, same response), so the middleware logs
// the response as stored, not as a lost lock, and the key replays it.
func TestALostCompletionReplyIsStoredOnce(t *testing.T) {
	t.Parallel()
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := &faultyStore{Store: open(t)}
			store.loseReplies.Store(true)
			var log syncBuffer
			mw, err := server.New(server.Config{Store: store, Scope: server.SingleTenant,
				Logger: slog.New(slog.NewTextHandler(&log, nil))})
			require.NoError(t, err)
			defer mw.Close()
			var calls atomic.Int64
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1); created(w, r) }))
			post := func() *httptest.ResponseRecorder {
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodPost, "/orders", nil)
				req.Header.Set("Idempotency-Key", "k")
				h.ServeHTTP(rec, req)
				return rec
			}
			post()
			store.loseReplies.Store(false)
			require.Eventually(t, func() bool { return len(store.completeResults()) >= 2 }, timeout, tick)
			results := store.completeResults()
			assert.NoError(t, results[1], "the second Complete finds its own completion")
			require.Eventually(t, func() bool { return strings.Contains(log.String(), "stored after a store failure") }, timeout, tick)
			assert.NotContains(t, log.String(), "lock lost")
			again := post()
			assert.Equal(t, http.StatusCreated, again.Code)
			assert.Equal(t, "true", again.Header().Get("Idempotent-Replayed"))
			assert.EqualValues(t, 1, calls.Load())
		})
	}
}
