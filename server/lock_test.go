package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/server"
)

func TestStaleLockIsTakenOverAndTheLateHandlerIsFenced(t *testing.T) {
	t.Parallel()
	for name, store := range map[string]func(*testing.T) server.Store{
		"memory": func(*testing.T) server.Store { return server.NewMemoryStore() },
		"sqlite": func(t *testing.T) server.Store { return openSQLite(t) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			g := newGate()
			e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-Attempt") == "first" {
					g.wait() // hangs as if its process had died
					_, _ = w.Write([]byte("late answer"))
					return
				}
				_, _ = w.Write([]byte("taker's answer"))
			}, withStore(store(t)), func(c *server.Config) { c.LockTimeout = time.Hour })

			firstDone := make(chan reply, 1)
			go func() {
				r, err := e.send(context.Background(), http.MethodPost, "/orders", "{}", "Idempotency-Key", "k", "X-Attempt", "first")
				assert.NoError(t, err)
				firstDone <- r
			}()
			g.waitEntered(t)
			assert.Equal(t, http.StatusConflict, e.post("/orders", "k", "{}").Status, "a fresh lock gets 409")
			s, _, _ := e.status("k")
			assert.Equal(t, wire.StateProcessing, s.State)

			e.clock.Advance(time.Hour + time.Second)
			s, _, r := e.status("k")
			assert.Equal(t, wire.StateNotFound, s.State, "a stale lock reads as not_found: sending the request is what to do")
			assert.Equal(t, http.StatusNotFound, r.Status)

			taker := e.post("/orders", "k", "{}")
			assert.Equal(t, http.StatusOK, taker.Status)
			assert.Equal(t, "taker's answer", taker.Body, "the next request with the key takes the entry over and runs")
			assert.False(t, taker.replayed())

			g.release()
			late := <-firstDone
			assert.Equal(t, http.StatusConflict, late.Status, "the fenced handler's answer is neither stored nor sent")
			assert.Equal(t, wire.ProblemInProgress, late.problem(t).Type)

			replay := e.post("/orders", "k", "{}")
			assert.True(t, replay.replayed())
			assert.Equal(t, "taker's answer", replay.Body, "the late Complete did not overwrite the taker's")
			assert.EqualValues(t, 2, e.calls.Load())
		})
	}
}

func TestStaleLockIsNotTakenOverWithAnotherPayload(t *testing.T) {
	t.Parallel()
	g := newGate()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) { g.wait() }, func(c *server.Config) { c.LockTimeout = time.Hour })
	go e.send(context.Background(), http.MethodPost, "/orders", `{"n":1}`, "Idempotency-Key", "k") //nolint:errcheck
	g.waitEntered(t)
	e.clock.Advance(2 * time.Hour)
	r := e.post("/orders", "k", `{"n":2}`)
	assert.Equal(t, http.StatusUnprocessableEntity, r.Status)
	g.release()
}

func TestHeartbeatKeepsASlowHandlersLock(t *testing.T) {
	t.Parallel()
	g := newGate()
	const lockTimeout = 90 * time.Millisecond
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		g.wait()
		_, _ = w.Write([]byte("slow but alive"))
	}, func(c *server.Config) { c.LockTimeout = lockTimeout })
	done := make(chan reply, 1)
	go func() {
		r, err := e.send(context.Background(), http.MethodPost, "/orders", "{}", "Idempotency-Key", "k")
		assert.NoError(t, err)
		done <- r
	}()
	g.waitEntered(t)
	// The clock jumps past the lock timeout; the heartbeat, which runs every
	// LockTimeout/3 of real time, renews the lock at the new time.
	e.clock.Advance(time.Hour)
	moved := e.clock.Now()
	require.Eventually(t, func() bool {
		en, err := e.store.Get(context.Background(), "", "k", moved)
		return err == nil && en.LockedAt.Equal(moved)
	}, timeout, tick, "the heartbeat must renew the lock while the handler runs")
	r := e.post("/orders", "k", "{}")
	assert.Equal(t, http.StatusConflict, r.Status, "a renewed lock is not taken over")
	s, _, _ := e.status("k")
	assert.Equal(t, wire.StateProcessing, s.State)
	g.release()
	assert.Equal(t, "slow but alive", (<-done).Body)
	assert.EqualValues(t, 1, e.calls.Load())
}

func TestExpiredEntryIsANewRequest(t *testing.T) {
	t.Parallel()
	e := newEnv(t, created, func(c *server.Config) { c.Retention = 2 * time.Hour })
	e.post("/orders", "k", `{"n":1}`)
	e.clock.Advance(2*time.Hour - time.Second)
	assert.True(t, e.post("/orders", "k", `{"n":1}`).replayed(), "within the retention the key is replayed")

	e.clock.Advance(time.Second)
	s, _, _ := e.status("k")
	assert.Equal(t, wire.StateNotFound, s.State, "an expired entry reads as absent before it is swept")
	r := e.post("/orders", "k", `{"n":2}`)
	assert.Equal(t, http.StatusCreated, r.Status, "after the retention a reuse is a new request, whatever its payload")
	assert.False(t, r.replayed())
	assert.Equal(t, `{"echo":{"n":2}}`, r.Body)
	assert.EqualValues(t, 2, e.calls.Load())
}

func TestRetentionCountsFromCompletion(t *testing.T) {
	t.Parallel()
	g := newGate()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		g.wait()
		created(w, r)
	}, func(c *server.Config) { c.Retention = 2 * time.Hour; c.LockTimeout = time.Hour })
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = e.send(context.Background(), http.MethodPost, "/orders", `{}`, "Idempotency-Key", "k")
	}()
	g.waitEntered(t)
	e.clock.Advance(30 * time.Minute)
	g.release()
	<-done
	e.clock.Advance(2*time.Hour - time.Minute)
	assert.True(t, e.post("/orders", "k", `{}`).replayed(), "the stored response is kept for the retention after it was stored")
}

func TestSweeperDeletesExpiredEntries(t *testing.T) {
	t.Parallel()
	store := server.NewMemoryStore()
	e := newEnv(t, created, withStore(store), func(c *server.Config) {
		c.Retention = time.Hour
		c.SweepInterval = 10 * time.Millisecond
	})
	e.post("/orders", "old", "{}")
	e.clock.Advance(30 * time.Minute)
	e.post("/orders", "young", "{}")
	require.Equal(t, 2, store.Len())
	e.clock.Advance(31 * time.Minute)
	require.Eventually(t, func() bool { return store.Len() == 1 }, timeout, tick, "the sweeper deletes the expired entry")
	_, err := store.Get(context.Background(), "", "young", e.clock.Now())
	assert.NoError(t, err, "the young entry stays")
}

func TestSweepOnDemand(t *testing.T) {
	t.Parallel()
	store := openSQLite(t)
	e := newEnv(t, created, withStore(store), func(c *server.Config) { c.Retention = time.Hour })
	for _, k := range []string{"a", "b", "c"} {
		e.post("/orders", k, "{}")
	}
	n, err := e.mw.Sweep(context.Background())
	require.NoError(t, err)
	assert.Zero(t, n)
	e.clock.Advance(time.Hour)
	n, err = e.mw.Sweep(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 3, n)
}
