package postgres_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/server"
)

// The tests of this file set what an operator sets for a role or a
// database (ALTER ROLE / ALTER DATABASE ... SET), on a database and a
// role of the test's own, and run the store and the journal through their
// public API under them.

// logTally keeps the middleware's warnings and errors: a store failure,
// a lock lost, a response not stored.
type logTally struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logTally) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *logTally) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	l.mu.Lock()
	l.msgs = append(l.msgs, b.String())
	l.mu.Unlock()
	return nil
}
func (l *logTally) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logTally) WithGroup(string) slog.Handler      { return l }

func (l *logTally) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs...)
}

// storeStorm runs many concurrent clients against two replicas of an API
// whose keys are in a postgres.Store on pool, on one key and on many,
// through every write of the store: new claims (one at a time and in
// batches), completions, renewals (a slow handler outlives a third of the
// lock timeout), releases (a handler that answers 500 first, under
// SkipServerErrors), sweeps (every 300 ms), and the replacement of expired
// entries (keys sent again once their entry expired). It checks that each
// key ran its handler as often as the requests call for, that every client
// got its answer, and that no request was answered 503 and nothing was
// logged as failed.
func storeStorm(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	// The lock of the two replicas that run the slow keys. A renewal,
	// sent at a third of it, must commit within another third, while
	// hundreds of requests queue for the pool's six sessions (the queue
	// is first come, first served: a renewal waits behind every claim
	// sent before it). At 3 s a renewal on a loaded machine (the module's
	// tests with -parallel 4) missed it, the handler was told to stop and
	// its key ran again; at 6 s a completion on the short-lock replica,
	// which then shared the pool, missed its 2 s on CI.
	const lockTimeout = 9 * time.Second
	logs := &logTally{}
	var (
		mu   sync.Mutex
		runs = map[string]int{} // tenant/key → handler runs
	)
	handler := func(replica string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			key := tenantOf(r) + "/" + r.Header.Get("Idempotency-Key")
			mu.Lock()
			runs[key]++
			n := runs[key]
			mu.Unlock()
			if strings.HasPrefix(r.Header.Get("Idempotency-Key"), "fails-first-") && n == 1 {
				http.Error(w, "failed before acting", http.StatusInternalServerError)
				return
			}
			if strings.HasPrefix(r.Header.Get("Idempotency-Key"), "slow-") {
				select {
				case <-time.After(lockTimeout/3 + 200*time.Millisecond): // renewed once
				case <-r.Context().Done():
					http.Error(w, "interrupted", http.StatusServiceUnavailable)
					return
				}
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "%s run %d on %s", key, n, replica)
		}
	}
	var replicas []*httptest.Server
	// The third replica's entries expire soon after their run (Retention
	// must outlast LockTimeout): its keys' handler is quick. Its lock is
	// short, so it has a pool of its own, on the same database, role and
	// schema: its completions do not queue behind the storm's claims.
	shortPoolCfg := pool.Config().Copy()
	shortPoolCfg.MaxConns = 2
	shortPool, err := pgxpool.NewWithConfig(ctx, shortPoolCfg)
	require.NoError(t, err)
	t.Cleanup(shortPool.Close)
	for i, c := range []struct {
		pool            *pgxpool.Pool
		lock, retention time.Duration
	}{
		{pool, lockTimeout, time.Hour}, {pool, lockTimeout, time.Hour}, {shortPool, 3 * time.Second, 3200 * time.Millisecond},
	} {
		store := openStoreIn(t, c.pool, "idem")
		mw, err := server.New(server.Config{Store: store, Scope: tenantOf, LockTimeout: c.lock,
			Retention: c.retention, SweepInterval: 300 * time.Millisecond, StorePolicy: server.SkipServerErrors,
			Logger: slog.New(logs)})
		require.NoError(t, err)
		srv := httptest.NewServer(mw.Handler(handler(fmt.Sprint("replica-", i))))
		srv.Client().Transport.(*http.Transport).MaxIdleConnsPerHost = 64
		t.Cleanup(func() {
			srv.Close()
			assert.NoError(t, mw.Close())
		})
		replicas = append(replicas, srv)
	}

	type result struct {
		key     string
		answers []string // the statuses before the final one, in order
		final   string
	}
	var (
		results = make(chan result, 4096)
		wg      sync.WaitGroup
	)
	// send sends one request with key to srv until it is answered 201
	// (409 in progress, and the 500 of a fails-first key, are sent again).
	send := func(srv *httptest.Server, tenant, key string) {
		defer wg.Done()
		res := result{key: tenant + "/" + key}
		for range 2000 {
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":"x"}`))
			require.NoError(t, err)
			req.Header.Set("X-Tenant", tenant)
			req.Header.Set("Idempotency-Key", key)
			resp, err := srv.Client().Do(req)
			if err != nil {
				res.answers = append(res.answers, err.Error())
				break
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusCreated:
				res.final = string(body)
				results <- res
				return
			case http.StatusConflict, http.StatusInternalServerError:
				res.answers = append(res.answers, fmt.Sprint(resp.StatusCode))
				time.Sleep(10 * time.Millisecond)
			default:
				res.answers = append(res.answers, fmt.Sprintf("%d %s", resp.StatusCode, body))
				results <- res
				return
			}
		}
		results <- res
	}

	// One key, 48 clients at once, spread over the replicas; and 150 keys
	// (a third slow, a seventh failing first) sent by two clients each at
	// once, on two replicas.
	for i := range 48 {
		wg.Add(1)
		go send(replicas[i%2], "acme", "the-one-key")
	}
	var keys []string
	for i := range 150 {
		key := fmt.Sprint("key-", i)
		switch {
		case i%7 == 0:
			key = fmt.Sprint("fails-first-", i)
		case i%3 == 0:
			key = fmt.Sprint("slow-", i)
		}
		keys = append(keys, key)
		for c := range 2 {
			wg.Add(1)
			go send(replicas[c], fmt.Sprint("tenant-", i%5), key)
		}
	}
	// Keys on the short-retention replica, sent once, then again once
	// their entries expired: by then swept, or replaced by the claim.
	for i := range 40 {
		wg.Add(1)
		go send(replicas[2], "expiring", fmt.Sprint("exp-", i))
	}
	wg.Wait()
	time.Sleep(3500 * time.Millisecond) // past the 3.2 s retention
	for i := range 40 {
		for range 2 {
			wg.Add(1)
			go send(replicas[2], "expiring", fmt.Sprint("exp-", i))
		}
	}
	wg.Wait()
	close(results)

	finals := map[string]map[string]bool{} // key → distinct final bodies
	var bad []string
	for r := range results {
		if r.final == "" {
			bad = append(bad, fmt.Sprintf("%s: %v", r.key, r.answers))
			continue
		}
		if finals[r.key] == nil {
			finals[r.key] = map[string]bool{}
		}
		finals[r.key][r.final] = true
		for _, a := range r.answers {
			if a != "409" && !(a == "500" && strings.Contains(r.key, "/fails-first-")) {
				bad = append(bad, fmt.Sprintf("%s: answered %s", r.key, a))
			}
		}
	}
	assert.Empty(t, bad, "requests answered otherwise than 201, 409, or a fails-first key's 500")
	var failures []string
	for _, m := range logs.all() {
		// A sweep cut off by its own bound (SweepInterval) on a busy
		// machine is taken up by the next one; any other failure counts.
		if !(strings.HasPrefix(m, "idempotency store sweep failed") && strings.HasSuffix(m, "context deadline exceeded")) {
			failures = append(failures, m)
		}
	}
	assert.Empty(t, failures, "the middleware logged store failures")
	mu.Lock()
	defer mu.Unlock()
	want := map[string]int{"acme/the-one-key": 1}
	for i, k := range keys {
		want[fmt.Sprintf("tenant-%d/%s", i%5, k)] = 1
		if strings.HasPrefix(k, "fails-first-") {
			want[fmt.Sprintf("tenant-%d/%s", i%5, k)] = 2
		}
	}
	for i := range 40 {
		want[fmt.Sprint("expiring/exp-", i)] = 2
	}
	assert.Equal(t, want, runs, "handler runs per key")
	for k, bodies := range finals {
		if !strings.HasPrefix(k, "expiring/") {
			assert.Len(t, bodies, 1, "%s: every client got the same run's answer", k)
		}
	}
}

// TestStoreKeepsItsPromiseWhateverTheDefaultIsolation: a role or a
// database whose default_transaction_isolation is repeatable read or
// serializable makes every implicit transaction of the store's run at that
// level, where concurrent writes to one key (and, serializable, to
// neighbouring keys) fail with SQLSTATE 40001 instead of waiting and
// checking again: each such failure was a 503 that invites the request
// again, or a lock renewal, a release or a completion that failed.
func TestStoreKeepsItsPromiseWhateverTheDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"role", "database"} {
		for _, iso := range []string{"repeatable read", "serializable"} {
			t.Run(level+"/"+iso, func(t *testing.T) {
				db := poolWithDefaults(t, level, 6, map[string]string{"default_transaction_isolation": iso})
				var got string
				require.NoError(t, db.pool.QueryRow(ctx, `SHOW default_transaction_isolation`).Scan(&got))
				require.Equal(t, iso, got, "the %s's default reaches the store's sessions", level)
				storeStorm(t, db.pool)
			})
		}
	}
}

// journalStorm runs three workers, each with its own pool of db's role
// (or on db's database), its own journal and client, through every write
// of the journal: intents, claims (each client's background Resume),
// outcomes, lease renewals, Sync (Close), and the owners' writes (Register, a
// liveness session taken again after an administrator ends it, every
// 200 ms for one worker, the sweep of gone owners, unregistering). Each
// worker calls Do for 40 operations, 4 at a time, through a server that
// drops a fifth of the answers after committing; each Do is called again
// until it succeeds. Every error is counted, every operation must succeed
// with one order each.
func journalStorm(t *testing.T, db *defaultsDB) {
	t.Helper()
	srv := testserver.Start(t)
	srv.InjectN(testserver.DropAfterCommit, 24)
	var clients []*idem.Client
	var journals []*postgres.Journal
	for i := range 3 {
		cfg := db.pool.Config().Copy()
		cfg.MaxConns = 5
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		j := openOn(t, pool, "idem")
		journals = append(journals, j)
		c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.StatusURL),
			Owner: fmt.Sprint("worker-", i), ResumeInterval: 100 * time.Millisecond, LeaseDuration: 2 * time.Second,
			AttemptTimeout: 10 * time.Second})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	stop := make(chan struct{})
	var side sync.WaitGroup
	var sideErrs []error
	var sideMu sync.Mutex
	sideErr := func(err error) {
		sideMu.Lock()
		sideErrs = append(sideErrs, err)
		sideMu.Unlock()
	}
	side.Add(2)
	go func() { // an administrator ends worker-1's liveness session, again and again
		defer side.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			_, _ = db.admin.Exec(ctx, `SELECT pg_terminate_backend(l.pid) FROM (`+livenessLocks("idem", "l.pid")+`) AS l(pid)`,
				`idem.owners`, "worker-1")
		}
	}()
	go func() { // short-lived owners come and go on worker-2's journal
		defer side.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			unregister, err := journals[2].Register(ctx, fmt.Sprint("passer-", i))
			if err != nil {
				sideErr(err)
				continue
			}
			if err := unregister(); err != nil {
				sideErr(err)
			}
		}
	}()

	var (
		mu   sync.Mutex
		errs []string
		wg   sync.WaitGroup
	)
	for w, c := range clients {
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := range 10 {
					id := fmt.Sprintf("order-%d-%d-%d", w, g, n)
					for try := 0; ; try++ {
						_, err := c.Do(ctx, orderOp(id))
						if err == nil {
							break
						}
						mu.Lock()
						errs = append(errs, fmt.Sprintf("%s: %v", id, err))
						mu.Unlock()
						if try == 20 {
							return
						}
						time.Sleep(50 * time.Millisecond)
					}
				}
			}()
		}
	}
	wg.Wait()
	close(stop)
	side.Wait()
	assert.Empty(t, errs, "Do failed")
	assert.Empty(t, sideErrs, "Register or unregister failed")
	assert.Equal(t, 120, srv.TotalOrders(), "one order per operation")
	assert.Equal(t, 120, srv.Executions(), "the handler ran once per operation")
	for w := range 3 {
		for g := range 4 {
			for n := range 10 {
				rec, err := journals[0].Lookup(ctx, "default", fmt.Sprintf("order-%d-%d-%d", w, g, n))
				if assert.NoError(t, err) {
					assert.Equal(t, idem.StateSucceeded, rec.State, "%s", rec.ID)
				}
			}
		}
	}
	for _, c := range clients {
		assert.NoError(t, c.Close())
	}
}

// TestJournalKeepsItsPromiseWhateverTheDefaultIsolation: the journal's
// transactions begin at read committed; its statements outside them (the
// owners' writes: a registration, a new liveness session, the sweep of
// gone owners, an unregistration) ran at the role's or database's
// default isolation, where they meet another worker's judgement of the
// same owner and fail with SQLSTATE 40001.
func TestJournalKeepsItsPromiseWhateverTheDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"role", "database"} {
		for _, iso := range []string{"repeatable read", "serializable"} {
			t.Run(level+"/"+iso, func(t *testing.T) {
				db := poolWithDefaults(t, level, 5, map[string]string{"default_transaction_isolation": iso})
				journalStorm(t, db)
			})
		}
	}
}

// TestNoCallFailsOnASessionEndedForIdling: with idle_session_timeout
// set for the role below a second (pgxpool checks a connection before
// handing it out only once it idled for a second), the server ends the
// pool's idle sessions, and the first statement on such a connection met
// "terminating connection due to idle-session timeout" (57P05): a 503 for
// the store's request, an error for the journal's Do. Nothing of such a
// statement ran: it runs again on another session.
func TestNoCallFailsOnASessionEndedForIdling(t *testing.T) {
	t.Parallel()
	settings := map[string]string{"idle_session_timeout": "200ms"}
	// Idle past the timeout, within pgxpool's second.
	const idle = 600 * time.Millisecond
	t.Run("store", func(t *testing.T) {
		db := poolWithDefaults(t, "role", 3, settings)
		mw, err := server.New(server.Config{Store: openStoreIn(t, db.pool, "idem"), Scope: tenantOf})
		require.NoError(t, err)
		srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
		})))
		t.Cleanup(func() { srv.Close(); _ = mw.Close() })
		for i := range 4 {
			time.Sleep(idle)
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", nil)
			require.NoError(t, err)
			req.Header.Set("Idempotency-Key", fmt.Sprint("key-", i))
			resp, err := srv.Client().Do(req)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			assert.Equal(t, http.StatusCreated, resp.StatusCode, "request %d after idling: %s", i, body)
		}
	})
	t.Run("journal", func(t *testing.T) {
		db := poolWithDefaults(t, "role", 4, settings)
		srv := testserver.Start(t)
		j := openOn(t, db.pool, "idem")
		c := workerClient(t, j, srv, "worker")
		for i := range 4 {
			time.Sleep(idle)
			_, err := c.Do(ctx, orderOp(fmt.Sprint("order-", i)))
			assert.NoError(t, err, "Do %d after idling", i)
		}
		assert.Equal(t, 4, srv.TotalOrders())
		time.Sleep(idle)
		unregister, err := j.Register(ctx, "another-worker")
		if assert.NoError(t, err, "Register after idling") {
			assert.NoError(t, unregister())
		}
		time.Sleep(idle)
		n := 0
		for _, err := range j.List(ctx, idem.Filter{}) {
			require.NoError(t, err, "List after idling")
			n++
		}
		assert.Equal(t, 4, n)
		time.Sleep(idle)
		_, err = j.Prune(ctx, time.Now().Add(-time.Hour))
		assert.NoError(t, err, "Prune after idling")
	})
}

// shortTimeouts are timeouts an operator may set for a role, meant for
// the application's own sessions, well below what the journal's and the
// store's sessions idle or stay in a transaction.
var shortTimeouts = map[string]string{
	"statement_timeout": "500ms", "lock_timeout": "500ms",
	"idle_in_transaction_session_timeout": "500ms", "idle_session_timeout": "500ms",
}

// TestShortTimeoutsOfTheRoleFailNothing: statement_timeout, lock_timeout,
// idle_in_transaction_session_timeout and idle_session_timeout of half a
// second, set for the role, fail no request of the store's storm and no
// call of the journal's (sessions the server ended for idling are left
// behind, see TestNoCallFailsOnASessionEndedForIdling), and the liveness
// session, idle in its transaction for the worker's life, outlives them
// all (transaction_timeout, from PostgreSQL 17, is turned off for it as
// idle_in_transaction_session_timeout is; this server predates it, so
// only the version guard's older path runs here).
func TestShortTimeoutsOfTheRoleFailNothing(t *testing.T) {
	t.Parallel()
	t.Run("store", func(t *testing.T) {
		storeStorm(t, poolWithDefaults(t, "role", 6, shortTimeouts).pool)
	})
	t.Run("journal", func(t *testing.T) {
		journalStorm(t, poolWithDefaults(t, "role", 5, shortTimeouts))
	})
	t.Run("liveness", func(t *testing.T) {
		db := poolWithDefaults(t, "role", 4, shortTimeouts)
		a := openOn(t, db.pool, "idem")
		b := openOn(t, db.admin, "idem", postgres.LivenessGrace(0))
		keys := createRecords(t, b, 1)
		unregister, err := a.Register(ctx, "worker-a")
		require.NoError(t, err)
		defer unregister()
		_, err = a.Acquire(ctx, keys[0], "worker-a", time.Hour)
		require.NoError(t, err)
		pids := func() []int32 {
			rows, err := db.admin.Query(ctx, livenessLocks("idem", "l.pid"), "idem.owners", "worker-a")
			require.NoError(t, err)
			got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			require.NoError(t, err)
			return got
		}
		before := pids()
		require.Len(t, before, 1)
		var version int
		require.NoError(t, db.admin.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version))
		if version < 170000 {
			// The guard is what lets the lock be taken here: the server
			// refuses a transaction_timeout it does not know.
			_, err := db.admin.Exec(ctx, `SELECT set_config('transaction_timeout', '0', true)`)
			require.Error(t, err, "a server before 17 knows transaction_timeout")
		}
		time.Sleep(2 * time.Second) // four times every timeout
		assert.Equal(t, before, pids(), "the liveness session is the one it was")
		got, err := b.Claim(ctx, idem.ClaimRequest{Owner: "worker-b", Limit: 10, Lease: time.Hour})
		require.NoError(t, err)
		assert.Empty(t, got, "worker-a's operation is its own")
	})
}

// TestWritesRefusedByAReadOnlyDefaultSaySo: default_transaction_read_only
// set for the role after the journal and the store were opened (a guard
// during maintenance) is the operator's word, and neither overrides it.
// While it holds, the store answers 503 (retry later: nothing was run)
// and logs, and a Do fails before anything is sent, each with an error
// that matches postgres.ErrReadOnly and names the setting; once it is
// lifted, the same key and the same operation run, once.
func TestWritesRefusedByAReadOnlyDefaultSaySo(t *testing.T) {
	t.Parallel()
	db := poolWithDefaults(t, "role", 4, map[string]string{"application_name": "read-only-test"})
	logs := &logTally{}
	mw, err := server.New(server.Config{Store: openStoreIn(t, db.pool, "idem"), Scope: tenantOf, Logger: slog.New(logs)})
	require.NoError(t, err)
	var runs int
	api := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(func() { api.Close(); _ = mw.Close() })
	post := func() int {
		req, err := http.NewRequest(http.MethodPost, api.URL+"/orders", nil)
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := api.Client().Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	srv := testserver.Start(t)
	c, err := idem.New(idem.Config{Journal: openOn(t, db.pool, "idem", postgres.WithoutLiveness()), BaseURL: srv.URL,
		Status: idem.StatusEndpoint(srv.StatusURL)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })

	readOnly := func(on bool) {
		stmt := `ALTER ROLE ` + pgx.Identifier{db.name}.Sanitize() + ` RESET default_transaction_read_only`
		if on {
			stmt = `ALTER ROLE ` + pgx.Identifier{db.name}.Sanitize() + ` SET default_transaction_read_only = on`
		}
		_, err := db.admin.Exec(ctx, stmt)
		require.NoError(t, err)
		db.pool.Reset() // new sessions take the role's settings
	}
	readOnly(true)
	assert.Equal(t, http.StatusServiceUnavailable, post(), "a key that cannot be recorded is not run")
	assert.Zero(t, runs)
	if msgs := logs.all(); assert.NotEmpty(t, msgs) {
		assert.Contains(t, msgs[0], "default_transaction_read_only", "the log names the setting")
	}
	_, err = c.Do(ctx, orderOp("order-1"))
	require.Error(t, err)
	assert.ErrorIs(t, err, postgres.ErrReadOnly)
	assert.Contains(t, err.Error(), "default_transaction_read_only", "the error names the setting")
	assert.Zero(t, srv.Requests(), "nothing was sent")

	readOnly(false)
	assert.Equal(t, http.StatusCreated, post())
	assert.Equal(t, 1, runs)
	_, err = c.Do(ctx, orderOp("order-1"))
	require.NoError(t, err)
	assert.Equal(t, 1, srv.TotalOrders())
}

// TestOddSessionDefaultsChangeNothing: a role's DateStyle, TimeZone,
// search_path, client_encoding, IntervalStyle and extra_float_digits,
// under each of pgx's query modes (exec and the simple protocol being
// those a pool behind an older PgBouncer uses, which read results as
// text). The tables are named with their schema and times are numbers,
// but the server's clock was read as a timestamp, which in text is in the
// session's DateStyle (pgx could not parse the German style: every claim
// failed), and the liveness lock's statement runs in the simple
// protocol, which pgx refuses unless client_encoding is UTF8 (every
// Register failed).
func TestOddSessionDefaultsChangeNothing(t *testing.T) {
	t.Parallel()
	odd := map[string]string{"DateStyle": "German, DMY", "TimeZone": "Pacific/Chatham", "search_path": "nowhere",
		"client_encoding": "LATIN1", "IntervalStyle": "sql_standard", "extra_float_digits": "-3"}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			db := poolWithDefaults(t, "role", 4, odd)
			cfg := db.pool.Config().Copy()
			cfg.ConnConfig.DefaultQueryExecMode = mode
			if mode == pgx.QueryExecModeSimpleProtocol {
				// pgx runs nothing in the simple protocol in another
				// encoding: such a pool is the application's to set so.
				cfg.ConnConfig.RuntimeParams["client_encoding"] = "UTF8"
			}
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			var style string
			require.NoError(t, pool.QueryRow(ctx, `SHOW DateStyle`).Scan(&style))
			require.Equal(t, "German, DMY", style, "the role's default reaches the pool's sessions")

			srv := testserver.Start(t)
			c := workerClient(t, openOn(t, pool, "idem"), srv, "worker")
			for i := range 3 {
				_, err := c.Do(ctx, orderOp(fmt.Sprint("order-", i)))
				require.NoError(t, err)
			}
			assert.Equal(t, 3, srv.TotalOrders())

			mw, err := server.New(server.Config{Store: openStoreIn(t, pool, "idem"), Scope: tenantOf})
			require.NoError(t, err)
			api := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
			})))
			t.Cleanup(func() { api.Close(); _ = mw.Close() })
			for _, key := range []string{"k1", "k1", "k2"} {
				req, err := http.NewRequest(http.MethodPost, api.URL+"/orders", nil)
				require.NoError(t, err)
				req.Header.Set("Idempotency-Key", key)
				resp, err := api.Client().Do(req)
				require.NoError(t, err)
				_ = resp.Body.Close()
				assert.Equal(t, http.StatusCreated, resp.StatusCode, key)
			}
		})
	}
}

// TestReadingTextRefusesEscapedBytea: a pool that reads results as
// text (pgx's exec and simple-protocol modes, as behind an older
// PgBouncer) reads bytea in the session's bytea_output, and pgx reads only
// hex, the default. With escape set for the role, every store claim that
// met a key already there failed, and answered 503 after a read-back of
// 30 s; every read of a journal record failed. The store and the journal
// refuse such a pool at open, saying what to set.
func TestReadingTextRefusesEscapedBytea(t *testing.T) {
	t.Parallel()
	db := poolWithDefaults(t, "role", 3, map[string]string{"bytea_output": "escape"})
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := db.pool.Config().Copy()
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			defer pool.Close()
			_, err = postgres.OpenStore(ctx, pool, postgres.Schema("idem"))
			require.Error(t, err)
			assert.Contains(t, err.Error(), "bytea_output", "names the setting")
			assert.Contains(t, err.Error(), "idem", "names the schema")
			_, err = postgres.OpenJournal(ctx, pool, postgres.Schema("idem"))
			require.Error(t, err, "the journal reads bytea too: headers and bodies")
			assert.Contains(t, err.Error(), "bytea_output", "names the setting")

			cfg.ConnConfig.RuntimeParams["bytea_output"] = "hex" // as the error says
			pool, err = pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			defer pool.Close()
			s := openStoreIn(t, pool, "idem")
			j := openOn(t, pool, "idem", postgres.WithoutLiveness())
			keys := createRecords(t, j, 1)
			_, err = j.Get(ctx, keys[0])
			require.NoError(t, err, "a record read back")
			now := time.Now()
			req := server.ClaimRequest{Scope: "t", Key: mode.String(), Fingerprint: "fp", Method: "POST", Path: "/orders",
				Now: now, ExpiresAt: now.Add(time.Hour), StaleBefore: now.Add(-time.Minute)}
			first, err := s.Claim(ctx, req)
			require.NoError(t, err)
			require.True(t, first.Claimed)
			again, err := s.Claim(ctx, req)
			require.NoError(t, err, "a claim that reads the entry in its way")
			assert.False(t, again.Claimed)
			assert.Equal(t, "/orders", again.Entry.Path)
		})
	}
	// A pool that reads results in binary is not concerned.
	_, err := postgres.OpenStore(ctx, db.pool, postgres.Schema("idem"))
	require.NoError(t, err)
	openOn(t, db.pool, "idem", postgres.WithoutLiveness())
}

// TestRegisterWhateverTheDefaultIsolation: a registration writes the
// owner's row, then takes its lock and marks the new session in the row;
// meanwhile another worker's claim may mark the row too (it found no
// lock). At a role's repeatable read or serializable, the mark met the
// other's update with SQLSTATE 40001, and Register failed. Here an
// administrator's transactions update the row again and again, each held
// open a moment, as other workers' marks would.
func TestRegisterWhateverTheDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, iso := range []string{"repeatable read", "serializable"} {
		t.Run(iso, func(t *testing.T) {
			db := poolWithDefaults(t, "role", 4, map[string]string{"default_transaction_isolation": iso})
			j := openOn(t, db.pool, "idem")
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, _ = db.admin.Exec(ctx, `UPDATE idem.owners SET name = name WHERE name LIKE 'worker-%'; SELECT pg_sleep(0.03)`)
				}
			}()
			defer func() { close(stop); <-done }()
			for i := range 10 {
				unregister, err := j.Register(ctx, fmt.Sprint("worker-", i))
				require.NoError(t, err, "registration %d", i)
				require.NoError(t, unregister(), "unregistration %d", i)
			}
		})
	}
}
