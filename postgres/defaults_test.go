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

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
				case <-time.After(1200 * time.Millisecond): // over a third of LockTimeout: renewed
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
	for i, retention := range []time.Duration{time.Hour, time.Hour, 3200 * time.Millisecond} {
		store := openStoreIn(t, pool, "idem")
		mw, err := server.New(server.Config{Store: store, Scope: tenantOf, LockTimeout: 3 * time.Second,
			Retention: retention, SweepInterval: 300 * time.Millisecond, StorePolicy: server.SkipServerErrors,
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
