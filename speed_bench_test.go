package idem_test

// BenchmarkSpeed is the side-by-side measurement of issue #14: the same
// POST made in five ways, back to back in one process, at 1, 16 and 64
// callers. scripts/bench-speed.sh runs it in several processes and prints
// the medians and ratios that BENCHMARKS.md ("Speed") records.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-cleanhttp"
	"github.com/hashicorp/go-retryablehttp"
	_ "github.com/mattn/go-sqlite3"

	"github.com/idemkit/idem"
)

// The request of every configuration: a 1 KiB JSON body.
var (
	speedBody   = jbBytes(1024)
	speedHeader = http.Header{"Content-Type": {"application/json"}}
)

// speedCallers are the numbers of concurrent callers compared.
var speedCallers = []int{1, 16, 64}

// speedTransport is the transport every configuration shares the shape of:
// sized for 64 connections, so that each of at most 64 callers keeps its own
// (MaxIdleConnsPerHost 64; MaxConnsPerHost 0, no limit, which a closed loop
// of 64 callers never reaches past 64).
func speedTransport() *http.Transport {
	t := cleanhttp.DefaultPooledTransport()
	t.MaxIdleConnsPerHost = 64
	t.MaxConnsPerHost = 0
	return t
}

// speedRetryClient is the plain go-retryablehttp client of the baselines, as
// BenchmarkDo configures it (no logger).
func speedRetryClient() *retryablehttp.Client {
	return &retryablehttp.Client{HTTPClient: &http.Client{Transport: speedTransport()},
		RetryMax: 4, CheckRetry: retryablehttp.DefaultRetryPolicy, Backoff: retryablehttp.DefaultBackoff,
		RetryWaitMin: 100 * time.Millisecond, RetryWaitMax: 5 * time.Second}
}

// BenchmarkSpeed compares, at 1, 16 and 64 callers in a closed loop, against
// a loopback server in the same process that answers every POST with a small
// 201 JSON at once:
//
//   - plain: a go-retryablehttp POST, no journal;
//   - naive: the same POST behind naiveJournal, the journal a user would
//     write by hand (two fsynced transactions per operation);
//   - idem: Client.Do on OpenSQLite (synchronous=FULL, group commit, a
//     success committed before Do returns);
//   - idem-ordered-keys: idem with Config.Keys KeyTimeOrdered (UUIDv7), whose
//     keys go to the end of the journal's key index instead of a random
//     page of it;
//   - memory: Client.Do on a MemoryJournal, the client's own cost;
//   - memory-floor: clientFloor, the least a journaled call costs in
//     memory under the client's contract, on plain go-retryablehttp.
//
// fsync is one 200-byte append and fsync of the same disk, the unit of the
// latency target. Each configuration reports ops/s, p50-µs and p99-µs per
// call, cpu-µs/op of the whole process (client, server and journal) and
// allocations; the journals report fsyncs/op by their own count (see
// speedFsyncs). The configurations are the inner loop, so that those
// compared with each other run seconds apart.
//
//	scripts/bench-speed.sh
//	go test -run '^$' -bench '^BenchmarkSpeed$' -benchtime 2s .
func BenchmarkSpeed(b *testing.B) {
	b.Run("fsync", benchWriteFsync)
	for _, callers := range speedCallers {
		b.Run(fmt.Sprintf("plain/callers=%d", callers), func(b *testing.B) {
			speedPlain(b, callers)
		})
		b.Run(fmt.Sprintf("naive/callers=%d", callers), func(b *testing.B) {
			speedNaive(b, callers)
		})
		b.Run(fmt.Sprintf("idem/callers=%d", callers), func(b *testing.B) {
			speedIdem(b, callers, idem.KeyRandom)
		})
		b.Run(fmt.Sprintf("idem-ordered-keys/callers=%d", callers), func(b *testing.B) {
			speedIdem(b, callers, idem.KeyTimeOrdered)
		})
		b.Run(fmt.Sprintf("memory/callers=%d", callers), func(b *testing.B) {
			speedDo(b, idem.NewMemoryJournal(), callers, idem.KeyRandom)
			b.ReportMetric(0, "fsyncs/op")
		})
		b.Run(fmt.Sprintf("memory-floor/callers=%d", callers), func(b *testing.B) {
			speedFloor(b, callers)
		})
	}
}

// BenchmarkSpeedPaired judges issue #24's target for the client alone
// (memory at least 0.75× plain's ops/s, its CPU per call at most about
// 1.33× plain's) on a busy machine: each of its b.N rounds runs 2,000
// plain go-retryablehttp POSTs, 2,000 calls of the client's contract
// floor (clientFloor) and 2,000 Do calls on a MemoryJournal in one
// process, the order rotating from round to round, and reports the
// median ratios of the thirds' process CPU to plain's and memory's to
// the floor's (see pairedRounds). One MemoryJournal client and one floor
// serve every round, so that their kept records grow over the run as in
// BenchmarkSpeed. No collection is forced between the thirds: the
// collector runs as paced, every so many bytes allocated, marking the
// kept records each time, as it does in BenchmarkSpeed (a collection
// forced before each third would do most of that marking outside all of
// them once the kept records outweigh what a third allocates). The plain
// third pays for the cycles its own allocations start, which mark the
// kept records too: the ratios understate what the collector costs the
// other two.
//
//	go test -run '^$' -bench 'SpeedPaired' -benchtime 21x .
func BenchmarkSpeedPaired(b *testing.B) {
	const per = 2000
	for _, callers := range speedCallers {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			srv := benchServer(b)
			rc := speedRetryClient()
			url := srv.URL + "/orders"
			plain := func() time.Duration {
				return halfCPU(b, per, callers, func(int64) error {
					_, err := speedPost(context.Background(), rc, url, "")
					return err
				})
			}
			c, err := idem.New(idem.Config{Journal: idem.NewMemoryJournal(), BaseURL: srv.URL,
				HTTPClient: &http.Client{Transport: speedTransport()}})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			var done int64 // operations of the rounds before: each call's ID is new
			memory := func() time.Duration {
				first := done
				done += per
				return halfCPU(b, per, callers, func(i int64) error {
					res, err := c.Do(context.Background(), idem.Op{ID: fmt.Sprint("checkout/cart-", first+i),
						URL: "/orders", Header: speedHeader, Body: speedBody})
					if err != nil {
						return err
					}
					if res.StatusCode != http.StatusCreated {
						return fmt.Errorf("status %d", res.StatusCode)
					}
					return nil
				})
			}
			f := newClientFloor(speedRetryClient())
			var floorDone int64
			floor := func() time.Duration {
				first := floorDone
				floorDone += per
				return halfCPU(b, per, callers, func(i int64) error {
					return floorCall(f, url, fmt.Sprint("checkout/cart-", first+i))
				})
			}
			pairedRounds(b, per, pairedPart{"plain", plain}, pairedPart{"floor", floor}, pairedPart{"memory", memory})
		})
	}
}

func speedPlain(b *testing.B, callers int) {
	srv := benchServer(b)
	rc := speedRetryClient()
	url := srv.URL + "/orders"
	b.ReportAllocs()
	runConcurrent(b, callers, func(int64) error {
		_, err := speedPost(context.Background(), rc, url, "")
		return err
	})
	b.ReportMetric(0, "fsyncs/op")
}

// speedPost sends the benchmark's POST through rc, with key as its
// Idempotency-Key if not empty, and returns the status code.
func speedPost(ctx context.Context, rc *retryablehttp.Client, url, key string) (int, error) {
	req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, url, speedBody)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := rc.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if err := resp.Body.Close(); err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusCreated {
		return resp.StatusCode, fmt.Errorf("status %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}

func speedNaive(b *testing.B, callers int) {
	srv := benchServer(b)
	nj, err := openNaiveJournal(filepath.Join(b.TempDir(), "naive.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer nj.Close()
	rc := speedRetryClient()
	url := srv.URL + "/orders"
	b.ReportAllocs()
	before := nj.commits.Load()
	runConcurrent(b, callers, func(int64) error {
		return nj.post(context.Background(), rc, url)
	})
	b.ReportMetric(float64(nj.commits.Load()-before)/float64(b.N), "fsyncs/op")
}

func speedIdem(b *testing.B, callers int, keys idem.KeyKind) {
	j, err := idem.OpenSQLite(filepath.Join(b.TempDir(), "ops.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	before := j.Stats()
	speedDo(b, j, callers, keys)
	after := j.Stats()
	n := float64(b.N)
	b.ReportMetric(float64(speedFsyncs(after)-speedFsyncs(before))/n, "fsyncs/op")
	b.ReportMetric(float64(after.DurableCommits+after.DeferredCommits-before.DurableCommits-before.DeferredCommits)/n, "commits/op")
}

// speedFsyncs is the number of fsyncs the journal has made by its own
// count: each durable commit (synchronous=FULL: SQLite fsyncs the WAL once)
// and each flush of deferred commits. Not counted, here or in naiveJournal:
// the fsyncs of WAL checkpoints and of a restarted WAL's header, which
// SQLite makes on its own; scripts/bench-speed.sh strace counts all of them.
func speedFsyncs(s idem.SQLiteStats) int64 { return s.DurableCommits + s.Flushes }

// speedDo runs Do for distinct operations, each a POST of the 1 KiB body,
// from callers goroutines. The operations' IDs are made before the timer
// starts, so that allocs/op counts Do's allocations (and the loopback
// server's) only.
func speedDo(b *testing.B, j idem.Journal, callers int, keys idem.KeyKind) {
	srv := benchServer(b)
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Keys: keys,
		HTTPClient: &http.Client{Transport: speedTransport()}})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = fmt.Sprint("checkout/cart-", i)
	}
	b.ReportAllocs()
	runConcurrent(b, callers, func(i int64) error {
		res, err := c.Do(context.Background(), idem.Op{ID: ids[i-1], URL: "/orders", Header: speedHeader, Body: speedBody})
		if err != nil {
			return err
		}
		if res.StatusCode != http.StatusCreated {
			return fmt.Errorf("status %d", res.StatusCode)
		}
		return nil
	})
}

// naiveJournal is the journal a user would write by hand in front of a
// retryablehttp POST, the baseline idem is measured against: one table on
// mattn/go-sqlite3 in WAL mode with synchronous=FULL, one connection, and
// per operation a transaction (BEGIN IMMEDIATE) that inserts the pending
// operation, the POST, then a transaction that records the outcome: two
// fsynced commits per operation. It is safe for concurrent use: callers
// queue for the one connection.
type naiveJournal struct {
	db *sql.DB
	// commits counts committed transactions, each one fsync of the WAL
	// (synchronous=FULL).
	commits atomic.Int64
}

const naiveSchema = `CREATE TABLE operations (
	key TEXT PRIMARY KEY,
	method TEXT NOT NULL,
	url TEXT NOT NULL,
	body BLOB,
	state TEXT NOT NULL,
	status_code INTEGER,
	error TEXT,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL
)`

func openNaiveJournal(path string) (*naiveJournal, error) {
	// _txlock=immediate: database/sql's Begin is BEGIN IMMEDIATE.
	db, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=WAL&_synchronous=FULL&_txlock=immediate")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	db.SetConnMaxLifetime(0)
	var mode string
	var sync int
	if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil {
		db.Close()
		return nil, err
	}
	if err := db.QueryRow(`PRAGMA synchronous`).Scan(&sync); err != nil {
		db.Close()
		return nil, err
	}
	if mode != "wal" || sync != 2 {
		db.Close()
		return nil, fmt.Errorf("naive journal: journal_mode %s, synchronous %d; want wal, 2 (FULL)", mode, sync)
	}
	if _, err := db.Exec(naiveSchema); err != nil {
		db.Close()
		return nil, err
	}
	return &naiveJournal{db: db}, nil
}

func (n *naiveJournal) Close() error { return n.db.Close() }

// post journals the operation as pending, sends it with rc under a new key,
// and records its outcome.
func (n *naiveJournal) post(ctx context.Context, rc *retryablehttp.Client, url string) error {
	key := uuid.NewString()
	now := time.Now().UnixNano()
	if err := n.write(ctx, `INSERT INTO operations (key, method, url, body, state, created_at, updated_at)
		VALUES (?, ?, ?, ?, 'pending', ?, ?)`, key, http.MethodPost, url, speedBody, now, now); err != nil {
		return err
	}
	status, err := speedPost(ctx, rc, url, key)
	state, msg := "succeeded", ""
	if err != nil {
		state, msg = "failed", err.Error()
	}
	return errors.Join(err, n.write(ctx, `UPDATE operations SET state = ?, status_code = ?, error = ?, updated_at = ? WHERE key = ?`,
		state, status, msg, time.Now().UnixNano(), key))
}

// write runs one statement in its own transaction.
func (n *naiveJournal) write(ctx context.Context, query string, args ...any) error {
	tx, err := n.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, query, args...); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	n.commits.Add(1)
	return nil
}
