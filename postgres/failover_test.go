package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres/internal/pgtest"
	"github.com/idemkit/idem/server"
)

// The tests of this file promote a streaming standby while a fleet runs:
// the primary crashes (pg_ctl stop -m immediate), the standby is
// promoted, and the fleet, which connects with a DSN that names both
// servers and target_session_attrs=read-write, carries on against the new
// primary.

// failoverPair starts a primary of the test's own and a streaming standby
// of it named "standby", synchronous or not, and returns them with the
// DSN the fleet connects with.
func failoverPair(t *testing.T, synchronous bool) (primary, standby *pgtest.Server, dsn string) {
	t.Helper()
	primary = pgtest.StartServer(t)
	standby = primary.StartStandby("standby")
	if synchronous {
		primary.SetSynchronousStandby("standby")
	}
	return primary, standby, pgtest.FailoverDSN(primary, standby)
}

// effectServer is an API behind the server middleware whose handler
// records every run under the key it ran for: a key run twice is a
// duplicate effect.
type effectServer struct {
	URL  string
	mu   sync.Mutex
	runs map[string]int
}

func startEffectServer(t *testing.T, store server.Store) *effectServer {
	t.Helper()
	if store == nil {
		store = server.NewMemoryStore()
	}
	mw, err := server.New(server.Config{Store: store, Scope: server.SingleTenant})
	require.NoError(t, err)
	e := &effectServer{runs: map[string]int{}}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		e.mu.Lock()
		e.runs[key]++
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q}`, key)
	})))
	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		srv.Close()
		assert.NoError(t, mw.Close())
	})
	e.URL = srv.URL
	return e
}

// ranFor returns how many times the handler ran for key.
func (e *effectServer) ranFor(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[key]
}

// keys returns every key the handler ran for.
func (e *effectServer) keys() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]int, len(e.runs))
	for k, n := range e.runs {
		out[k] = n
	}
	return out
}

// failoverClient is one worker's client on its own pool and journal, on
// the fail-over DSN.
//
// Its lease is 3 s, not the default 15 s, because that is how long a
// pending operation of a live worker waits for its Resume: an operation
// whose Do returned an error with the primary down (an intent in doubt,
// or an outcome or release lost with the primary) is under the worker's
// own lease, which its next Do of the operation takes up at once, but
// its Resume only once the lease lapses.
func failoverClient(t *testing.T, dsn, schema string, api *effectServer, owner string, keys idem.KeyKind) *idem.Client {
	t.Helper()
	j := openOn(t, checkedPool(t, dsn), schema)
	cfg := idem.Config{Journal: j, BaseURL: api.URL, Status: idem.StatusEndpoint(api.URL + "/idempotency"),
		Owner: owner, Keys: keys, AttemptTimeout: 10 * time.Second, LeaseDuration: 3 * time.Second}
	if keys == idem.KeyDeterministic {
		cfg.KeyNamespace = failoverNamespace
	}
	c, err := idem.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

var failoverNamespace = uuid.MustParse("6f1d8a52-3c4b-4e0f-9a71-2b5c8d9e0f13")

func orderOp(id string) idem.Op {
	return idem.Op{ID: id, Method: http.MethodPost, URL: "/orders",
		Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"item":"book","quantity":1}`)}
}

// doneCall is one Do of the fleet and what it returned.
type doneCall struct {
	id, key string
	err     error
	at      time.Time // when it returned
}

// TestFailoverToSynchronousStandbyLosesNothing: three workers run
// operations through Client.Do against an API whose middleware keeps its
// keys in the same cluster (postgres.Store); the primary crashes and the
// synchronous standby is promoted while they run. Every operation whose Do
// succeeded is on the new primary, every pending one is finished by
// Resume, the handler ran once for every key, every key it ran for is
// journaled, and the workers' Do calls succeed again after the promotion.
// The standby is cut off from the primary before the crash, so that
// commits wait for it when the primary goes: those that the fleet was
// never told of are not on the new primary, and the fleet finds that out
// (lost acknowledgements, read back) and carries on.
func TestFailoverToSynchronousStandbyLosesNothing(t *testing.T) {
	t.Parallel()
	began := time.Now()
	primary, standby, dsn := failoverPair(t, true)
	t.Logf("a primary and its synchronous standby started in %v", time.Since(began).Round(time.Millisecond))
	schema := "idem"
	api := startEffectServer(t, openStoreIn(t, checkedPool(t, dsn), "idem_store"))
	const workers = 3
	clients := make([]*idem.Client, workers)
	for i := range clients {
		clients[i] = failoverClient(t, dsn, schema, api, fmt.Sprintf("worker-%d", i+1), idem.KeyRandom)
	}

	var (
		mu        sync.Mutex
		calls     []doneCall
		succeeded atomic.Int64
		promoted  atomic.Int64 // UnixNano of the promotion's end; 0 before
		after     atomic.Int64 // successes of calls that started after it
		stop      atomic.Bool
		wg        sync.WaitGroup
	)
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				id := fmt.Sprintf("%s-%04d", c.Owner(), i)
				started := time.Now().UnixNano()
				res, err := c.Do(ctx, orderOp(id))
				d := doneCall{id: id, err: err, at: time.Now()}
				if err == nil {
					d.key = res.Key
					succeeded.Add(1)
					if p := promoted.Load(); p != 0 && started > p {
						after.Add(1)
					}
				}
				mu.Lock()
				calls = append(calls, d)
				mu.Unlock()
				if err != nil {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	}
	waitUntil(t, "15 operations to succeed before the fail-over", func() bool { return succeeded.Load() >= 15 })
	// The standby is cut off first, as the partition that loses
	// acknowledged writes with asynchronous replication does: here the
	// primary acknowledges no durable commit while its synchronous
	// standby is away, and the fleet's writes wait for it.
	standby.Detach()
	observer := checkedPool(t, primary.DSN())
	waitUntil(t, "a commit to wait for the synchronous standby", func() bool {
		var n int
		err := observer.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&n)
		return err == nil && n > 0
	})
	observer.Close()
	crashed := time.Now()
	t.Logf("%d operations succeeded in the %v before the crash", succeeded.Load(), crashed.Sub(began).Round(time.Millisecond))
	primary.Crash()
	standby.Promote()
	promotedAt := time.Now()
	promoted.Store(promotedAt.UnixNano())
	waitUntil(t, "15 operations started after the promotion to succeed", func() bool { return after.Load() >= 15 })
	stop.Store(true)
	wg.Wait()
	t.Logf("%d operations started after the promotion succeeded within %v of it", after.Load(), time.Since(promotedAt).Round(time.Millisecond))

	// What the fleet did, and when it carried on.
	var failed int
	firstAfter := time.Duration(-1)
	for _, d := range calls {
		if d.err != nil {
			if failed++; failed <= 3 {
				t.Logf("Do %s while the primary was down: %v", d.id, d.err)
			}
			continue
		}
		if d.at.After(promotedAt) && (firstAfter < 0 || d.at.Sub(promotedAt) < firstAfter) {
			firstAfter = d.at.Sub(promotedAt)
		}
	}
	t.Logf("%d Do calls, %d failed (the primary down, the standby not yet promoted); promotion took %v; first success %v after it",
		len(calls), failed, promotedAt.Sub(crashed).Round(time.Millisecond), firstAfter.Round(time.Millisecond))

	// Each worker finishes what it left pending.
	resumed := time.Now()
	for _, c := range clients {
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		rep, err := c.Resume(rctx, idem.ResumeWait())
		cancel()
		require.NoError(t, err)
		t.Logf("%s resumed: %+v", c.Owner(), rep)
	}
	t.Logf("the workers' Resume took %v", time.Since(resumed).Round(time.Millisecond))

	// On the new primary: everything acknowledged, each run once.
	journaled := map[string]string{} // key -> id
	lost := 0
	for i, d := range calls {
		rec, err := clients[0].Lookup(ctx, "", d.id)
		if errors.Is(err, idem.ErrNotFound) {
			if d.err == nil {
				lost++
				t.Errorf("operation %s: Do succeeded (key %s), the new primary has no record of it", d.id, d.key)
			}
			continue
		}
		require.NoError(t, err, "call %d", i)
		journaled[rec.Key] = d.id
		assert.Equal(t, idem.StateSucceeded, rec.State, "operation %s after Resume: %+v", d.id, rec)
		if d.err == nil {
			assert.Equal(t, d.key, rec.Key, "operation %s", d.id)
		}
		assert.Equal(t, 1, api.ranFor(rec.Key), "operation %s (key %s): the handler's runs", d.id, rec.Key)
	}
	dups := 0
	for key, n := range api.keys() {
		if n > 1 {
			dups++
		}
		_, ok := journaled[key]
		assert.True(t, ok, "the handler ran for key %s, which the new primary's journal does not hold", key)
	}
	assert.Zero(t, lost, "operations lost")
	assert.Zero(t, dups, "keys the handler ran for more than once")
	assert.Equal(t, len(journaled), len(api.keys()), "one run per journaled operation")
	t.Logf("%d operations journaled and run once each; lost %d, duplicated %d", len(journaled), lost, dups)
}

// waitUntil polls cond until it holds; two minutes bound a failing run,
// they are no measure.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "waited two minutes for %s", what)
	}
}

// TestFailoverToAsynchronousStandbyLosesWhatItHadNotReceived shows the
// cost of a fail-over with asynchronous replication, exactly: the
// standby is cut off from the primary (Detach), the primary acknowledges
// writes it alone has, then crashes, and the standby is promoted. Of the
// operations that completed while the standby was cut off, the new
// primary has no record: Resume cannot finish them, and a Do again with
// the same ID journals a new intent. With random keys (the default) it
// sends a new key, and the handler runs a second time; with
// deterministic keys it sends the same key, and a key store that did not
// fail over with the journal answers from the first run. A
// postgres.Store on the promoted standby has lost those keys too: the
// same key runs the handler again. What was replicated before the cut is
// all there; an outcome lost after its intent was replicated is found
// again by Resume, from the server.
func TestFailoverToAsynchronousStandbyLosesWhatItHadNotReceived(t *testing.T) {
	t.Parallel()
	primary, standby, dsn := failoverPair(t, false)
	api := startEffectServer(t, nil) // its keys elsewhere: they do not fail over
	random := failoverClient(t, dsn, "idem", api, "worker-random", idem.KeyRandom)
	determ := failoverClient(t, dsn, "idem", api, "worker-deterministic", idem.KeyDeterministic)
	storeAPI := startEffectServer(t, openStoreIn(t, checkedPool(t, dsn), "idem_store")) // its keys in the cluster
	post := func(key string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, storeAPI.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode, "POST with key %s", key)
	}
	do := func(c *idem.Client, id string) *idem.Result {
		t.Helper()
		res, err := c.Do(ctx, orderOp(id))
		require.NoError(t, err, "Do %s", id)
		require.Equal(t, http.StatusCreated, res.StatusCode, "Do %s", id)
		return res
	}
	const n = 5
	clients := map[string]*idem.Client{"random": random, "deterministic": determ}

	// Replicated: done before the cut, and the standby has replayed it.
	kept := map[string]*idem.Result{}
	for kind, c := range clients {
		for i := range n {
			id := fmt.Sprintf("kept-%s-%d", kind, i)
			kept[id] = do(c, id)
		}
	}
	begun, err := random.Begin(ctx, orderOp("begun")) // its intent replicated, not sent
	require.NoError(t, err)
	post("store-kept")
	primary.WaitReplayed("standby")
	standby.Detach()

	// Acknowledged by the primary alone.
	lost := map[string]*idem.Result{}
	lostKind := map[string]string{}
	for kind, c := range clients {
		for i := range n {
			id := fmt.Sprintf("lost-%s-%d", kind, i)
			lost[id], lostKind[id] = do(c, id), kind
		}
	}
	res, err := begun.Send(ctx)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	post("store-lost")

	crashed := time.Now()
	primary.Crash()
	standby.Promote()
	promoted := time.Now()
	do(random, "after-promotion")
	t.Logf("promotion took %v; the first Do after it returned %v later",
		promoted.Sub(crashed).Round(time.Millisecond), time.Since(promoted).Round(time.Millisecond))

	// Replicated before the cut: all there, as the fleet was told.
	for id, want := range kept {
		rec, err := random.Lookup(ctx, "", id)
		require.NoError(t, err, "operation %s, replicated before the cut", id)
		assert.Equal(t, idem.StateSucceeded, rec.State, "operation %s", id)
		assert.Equal(t, want.Key, rec.Key, "operation %s", id)
	}
	// Its intent replicated, its outcome not: the record reads as before
	// the send, and Resume finishes it from the server's stored answer.
	rec, err := random.Lookup(ctx, "", "begun")
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, rec.State, "the outcome written after the cut is gone")
	_, err = random.Resume(ctx, idem.ResumeWait())
	require.NoError(t, err)
	rec, err = random.Lookup(ctx, "", "begun")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
	assert.Equal(t, 1, api.ranFor(rec.Key), "the handler's runs for the operation whose outcome was lost")

	// Acknowledged after the cut: gone from the journal. A Do again with
	// the same ID journals a new intent.
	duplicated, deduped := 0, 0
	for id, first := range lost {
		_, err := random.Lookup(ctx, "", id)
		require.ErrorIs(t, err, idem.ErrNotFound, "operation %s, acknowledged by the primary alone", id)
		c := clients[lostKind[id]]
		again := do(c, id)
		assert.False(t, again.Journaled, "operation %s: the journal has forgotten its answer", id)
		switch lostKind[id] {
		case "random":
			assert.NotEqual(t, first.Key, again.Key, "operation %s: a new intent, a new random key", id)
			assert.False(t, again.Replayed, "operation %s", id)
			if api.ranFor(first.Key) == 1 && api.ranFor(again.Key) == 1 {
				duplicated++
			}
		case "deterministic":
			assert.Equal(t, first.Key, again.Key, "operation %s: the same ID, the same key", id)
			assert.True(t, again.Replayed, "operation %s: the key store answered from the first run", id)
			if api.ranFor(first.Key) == 1 {
				deduped++
			}
		}
	}
	assert.Equal(t, n, duplicated, "operations of random keys whose handler ran twice")
	assert.Equal(t, n, deduped, "operations of deterministic keys whose handler ran once")

	// The server's store on the promoted standby.
	post("store-kept")
	assert.Equal(t, 1, storeAPI.ranFor("store-kept"), "a key completed before the cut is replayed")
	post("store-lost")
	assert.Equal(t, 2, storeAPI.ranFor("store-lost"), "a key completed after the cut is gone: its handler runs again")
	t.Logf("operations acknowledged after the cut: %d, all lost from the journal; retried with the same ID, %d of random keys ran twice, %d of deterministic keys once; 1 of 1 keys completed after the cut ran twice behind postgres.Store",
		len(lost), duplicated, deduped)
}
