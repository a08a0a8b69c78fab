package postgres_test

// Journal benchmarks: Client.Do on the PostgreSQL journal against the SQLite
// journal and against a naive PostgreSQL journal, and a fleet of worker
// processes resuming one queue. They never run in a plain `go test`;
// BENCHMARKS.md gives the command, the numbers and the targets.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/benchcpu"
	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/journal"
	"github.com/idemkit/idem/journaltest"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// naiveJournal is BenchmarkDo's baseline: the PostgreSQL journal as one
// would first write it, without group commit. Each write of Do's path is
// one statement sent on its own (autocommitted) with synchronous_commit on,
// the server's default: one round trip, one commit and one WAL flush per
// write, two per operation.
//
//   - Create runs the journal's own insert: one INSERT of the operation,
//     ON CONFLICT (scope, op_id) DO NOTHING, that inserts its creation
//     event in the same statement. Only when it inserts nothing does it
//     read the existing record, to return it.
//   - Update by a lease holder (every Update of Do) is one UPDATE whose
//     WHERE clause applies the journal's rules (package journal,
//     ApplyUpdate): the holder's owner and epoch, the version the caller
//     read, a state the new one may follow, attempt counts that do not go
//     down. It locks the row, sets the new fields, extends the lease or
//     drops it when the operation settles, and inserts the event, all in
//     one statement (data-modifying CTEs), and returns the new record.
//     Only when it updates nothing does it read the record, to say which
//     rule refused the write.
//
// Everything else (an Update without a lease, which an operator makes,
// Acquire, Release, Claim, Renew and the reads) is the embedded journal's:
// Do's happy path does not use it. TestNaiveJournalConformance runs the
// journal conformance suite on it.
type naiveJournal struct {
	*postgres.Journal
	pool   *pgxpool.Pool
	update string

	mu     sync.RWMutex // writes hold it shared; Close waits for them
	closed bool
}

func newNaiveJournal(j *postgres.Journal, pool *pgxpool.Pool) *naiveJournal {
	s := pgschema.Ident(j.Schema())
	ops, events := s+".operations", s+".events"
	// $1 key, $2 owner, $3 epoch, $4 version, $5 the states the new one
	// may follow, $6 attempts, $7 resends, $8 state, $9 next_attempt_at,
	// $10 whether the lease stays, $11 its expiry, $12..$15 the response,
	// $16 last_error, $17 note, $18 now, $19 expires_at, $20 and $21 the
	// event's kind and detail. The operation's row of due follows it.
	update := `WITH old AS (
		SELECT id AS old_id, state AS old_state, note AS old_note, next_attempt_at AS old_next FROM ` + ops + `
		WHERE key = $1 AND lease_owner = $2 AND lease_epoch = $3 AND version = $4
			AND state = ANY($5::smallint[]) AND attempts <= $6 AND resends <= $7
		FOR UPDATE
	), upd AS (
		UPDATE ` + ops + ` SET state = $8, attempts = $6, resends = $7, next_attempt_at = $9,
			lease_owner = CASE WHEN $10 THEN lease_owner END,
			lease_expires_at = CASE WHEN $10 THEN greatest(lease_expires_at, $11) END,
			resp_status = $12, resp_header = $13, resp_body = $14, resp_replayed = $15,
			last_error = $16, note = $17, updated_at = $18, expires_at = $19, version = version + 1
		FROM old WHERE id = old_id
		RETURNING ` + postgres.RecordColumns + `, old_state, old_note
	), dd AS (
		DELETE FROM ` + s + `.due d USING old, upd
		WHERE d.next_attempt_at = old_next AND d.id = old_id AND upd.state NOT IN (1, 2, 3)
	), dm AS (
		UPDATE ` + s + `.due d SET next_attempt_at = upd.next_attempt_at FROM old, upd
		WHERE d.next_attempt_at = old_next AND d.id = old_id AND upd.state IN (1, 2, 3)
			AND old_next <> upd.next_attempt_at
	), ev AS (
		INSERT INTO ` + events + ` (op, version, at, kind, detail, from_state, to_state, attempt, status, error, owner)
		SELECT id, version, updated_at, $20, $21, old_state, state, attempts, resp_status,
			CASE WHEN note IS NOT NULL AND note IS DISTINCT FROM old_note THEN note ELSE last_error END, $2
		FROM upd
	)
	SELECT ` + postgres.RecordColumns + ` FROM upd`
	return &naiveJournal{Journal: j, pool: pool, update: update}
}

// enter refuses a write after Close, or with a context already done.
func (n *naiveJournal) enter(ctx context.Context) (func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	n.mu.RLock()
	if n.closed {
		n.mu.RUnlock()
		return nil, idem.ErrJournalClosed
	}
	return n.mu.RUnlock, nil
}

func (n *naiveJournal) Close() error {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	return n.Journal.Close()
}

// Create implements idem.Journal: one INSERT, autocommitted.
func (n *naiveJournal) Create(ctx context.Context, rec idem.Record) (idem.Record, bool, error) {
	nr, ev, err := journal.NewRecord(rec, time.Now(), 0)
	if err != nil {
		return idem.Record{}, false, err
	}
	done, err := n.enter(ctx)
	if err != nil {
		return idem.Record{}, false, err
	}
	defer done()
	b := &pgx.Batch{}
	n.QueueInsert(b, nr, ev)
	br := n.pool.SendBatch(ctx, b)
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "operations_key_key" {
		return idem.Record{}, false, fmt.Errorf("%w: %s", idem.ErrDuplicateKey, nr.Key)
	}
	if err != nil {
		return idem.Record{}, false, err
	}
	if tag.RowsAffected() > 0 {
		return nr, true, nil
	}
	ex, err := n.Journal.Lookup(ctx, nr.Scope, nr.ID)
	if err != nil {
		return idem.Record{}, false, err
	}
	if ex.Fingerprint != nr.Fingerprint {
		return ex, false, journal.FingerprintMismatch(ex)
	}
	return ex, false, nil
}

// Update implements idem.Journal: a lease holder's write is one fenced
// UPDATE, autocommitted, whatever d says.
func (n *naiveJournal) Update(ctx context.Context, rec idem.Record, d idem.Durability, why idem.Event) (idem.Record, error) {
	if err := journal.CheckDurability(d); err != nil {
		return idem.Record{}, err
	}
	if rec.Lease.Owner == "" {
		return n.Journal.Update(ctx, rec, d, why)
	}
	done, err := n.enter(ctx)
	if err != nil {
		return idem.Record{}, err
	}
	defer done()
	var from []int16
	for _, s := range journal.States() {
		if s.CanMoveTo(rec.State) {
			from = append(from, int16(s))
		}
	}
	var status, replayed any
	var header, body []byte
	if r := rec.Response; r != nil {
		status, replayed, header, body = r.StatusCode, r.Replayed, wire.EncodeHeader(r.Header), r.Body
		if body == nil {
			body = []byte{}
		}
	}
	_, out, err := postgres.ScanRecord(n.pool.QueryRow(ctx, n.update,
		rec.Key, rec.Lease.Owner, rec.Lease.Epoch, rec.Version, from, rec.Attempts, rec.TransportResends,
		int16(rec.State), unixMilli(rec.NextAttemptAt), rec.State.Active(), nullMilli(rec.Lease.ExpiresAt),
		status, header, body, replayed, nullText(rec.LastError), nullText(rec.Note),
		time.Now().UnixMilli(), nullMilli(rec.ExpiresAt), int16(why.Kind), nullText(why.Detail)))
	if !errors.Is(err, pgx.ErrNoRows) {
		return out, err
	}
	// Refused: read the record to say why.
	stored, err := n.Journal.Get(ctx, rec.Key)
	if err != nil {
		return idem.Record{}, err
	}
	if _, _, err := journal.ApplyUpdate(stored, rec, time.Now(), why, nil); err != nil {
		return idem.Record{}, err
	}
	return idem.Record{}, fmt.Errorf("%w: operation %s changed while it was written", idem.ErrConflict, rec.Key)
}

func unixMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func nullMilli(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMilli()
}

func nullText(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// The naive journal is a journal, not a strawman: it passes the suite.
func TestNaiveJournalConformance(t *testing.T) {
	t.Parallel()
	journaltest.Run(t, func(t *testing.T) idem.Journal {
		return newNaiveJournal(openJournal(t), pgtest.Pool(t))
	})
}

// commits returns how many transactions have written events in schema.
//
// Every write of the naive journal's, every Claim and every write after a
// read inserts an event (the journal's writes without a read keep theirs
// in the row, and BenchmarkDo counts its transactions with OnCommit),
// events are never updated, and a row's xmin is the id of the transaction that
// inserted it: the distinct xmins of the events are the committed
// transactions that wrote them (an aborted one leaves no visible row). Read
// before and after a timed loop, the difference counts the loop's write
// transactions, each with one commit. Unlike txid_current_snapshot or
// pg_stat_database, it counts the benchmark's schema alone, whatever else
// runs on the shared server. (Release writes no event, and is not on the
// paths measured; freezing replaces xmin, which does not happen to rows a
// few seconds old.)
func commits(b *testing.B, pool *pgxpool.Pool, schema string) int64 {
	b.Helper()
	var n int64
	err := pool.QueryRow(context.Background(),
		`SELECT count(DISTINCT xmin::text) FROM `+pgschema.Ident(schema)+`.events`).Scan(&n)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// fastServer answers every POST with a small 201 at once and counts them:
// the benchmarks measure the client and its journal, which share this
// machine's two cores with the server and PostgreSQL, so the server does
// nothing else (the orders server of internal/testserver would spend more
// per request than the client does).
func fastServer(b *testing.B) (*httptest.Server, *atomic.Int64) {
	b.Helper()
	var posts atomic.Int64
	answer := []byte(`{"order_id":"ord_123","status":"created"}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		posts.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(answer)
	}))
	b.Cleanup(srv.Close)
	return srv, &posts
}

func benchTransport(conns int) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = conns
	return t
}

// benchBody is the request every operation sends: 200 bytes.
var benchBody = bytes.Repeat([]byte("x"), 200)

// BenchmarkDo measures Client.Do of new operations (a durable Create, the
// POST to a loopback server, an Update with the outcome) from 1, 16 and 64
// concurrent callers, on the PostgreSQL journal (group commit), on the naive
// PostgreSQL journal (naiveJournal: idem's schema, a commit per write), on
// the simple naive journal (simpleNaive: what a user writes in an afternoon,
// without idem's client), on the contract's floor (contractFloor: the
// cheapest hand-written journal that keeps what idem's contract asks of a
// journaled call, without idem's client) and on the SQLite journal (synchronous=FULL, group
// commit), in the same run. The idem and naive PostgreSQL journals run on a
// pool of 32 connections, the simple naive one and the floor on pgxpool's defaults, each
// pool its own (so that its backends can be told apart) and each journal in
// a fresh schema; the SQLite journal in a temporary directory.
//
// It reports ops/s; commits/op, transactions committed per operation (for
// PostgreSQL counted in the server, see commits; for SQLite the journal's
// own count, durable and not; for the simple naive journal and the floor their own count);
// cpu-µs/op, the CPU time of this process (client, loopback server, pgx or
// SQLite) per operation; and pg-cpu-µs/op, that of the PostgreSQL backends
// serving the configuration's pool, read from /proc (see benchPool). The
// server's background processes (WAL writer, checkpointer) are not counted:
// with synchronous_commit on, a backend flushes its own commit's WAL.
// wal-B/op is the WAL the server wrote per operation (see readWAL): the
// configuration's own only on a server nobody else writes to.
//
//	go test -run '^$' -bench 'BenchmarkDo$' -benchtime 2s .
func BenchmarkDo(b *testing.B) {
	pg := func(b *testing.B, naive bool) opened {
		pool, pids := benchPool(b, 32)
		schema := pgtest.Schema(b)
		// The journal's transactions, counted by the journal itself: its
		// creates write no event (see commits).
		var n atomic.Int64
		j, err := postgres.OpenJournal(context.Background(), pool, postgres.Schema(schema),
			postgres.OnCommit(func(idem.CommitInfo) { n.Add(1) }))
		if err != nil {
			b.Fatal(err)
		}
		o := opened{j: j, commits: n.Load, pids: pids}
		if naive {
			o.j = newNaiveJournal(j, pool)
			o.commits = func() int64 { return commits(b, pgtest.Pool(b), schema) }
		}
		b.Cleanup(func() { _ = o.j.Close() })
		return o
	}
	journals := []struct {
		name string
		open func(b *testing.B) opened
	}{
		{"postgres", func(b *testing.B) opened { return pg(b, false) }},
		{"postgres-naive", func(b *testing.B) opened { return pg(b, true) }},
		{"postgres-simple", func(b *testing.B) opened { return openSimpleNaive(b) }},
		{"postgres-floor", func(b *testing.B) opened { _, o := openContractFloor(b, floorParts{}); return o }},
		{"sqlite", func(b *testing.B) opened {
			j, err := idem.OpenSQLite(filepath.Join(b.TempDir(), "ops.db"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = j.Close() })
			return opened{j: j, commits: func() int64 {
				s := j.Stats()
				return s.DurableCommits + s.DeferredCommits
			}}
		}},
	}
	for _, callers := range []int{1, 16, 64} {
		for _, jn := range journals {
			b.Run(fmt.Sprintf("callers=%d/journal=%s", callers, jn.name), func(b *testing.B) {
				benchDo(b, jn.open(b), callers)
			})
		}
	}
}

// opened is a configuration of BenchmarkDo: an idem journal, or (do set)
// an operation of its own, how to count its commits, and the pids of the
// PostgreSQL backends serving it.
type opened struct {
	j       idem.Journal
	do      func(ctx context.Context, url string, i int64) error
	commits func() int64
	pids    func() []int
	simple  *simpleNaive // the simple naive journal's, for BenchmarkWrites
}

// benchPool opens a pool of its own for one configuration, with at most
// conns connections (0: pgxpool's default), under an application_name no
// other pool has, and returns it with a function that lists the pids of
// its backends (asked of the tests' shared pool, whose backend is not
// counted). It is closed when the benchmark ends.
func benchPool(b *testing.B, conns int32) (*pgxpool.Pool, func() []int) {
	b.Helper()
	return benchPoolWith(b, conns, nil)
}

// benchPoolWith is benchPool whose sessions start with params set.
func benchPoolWith(b *testing.B, conns int32, params map[string]string) (*pgxpool.Pool, func() []int) {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	if err != nil {
		b.Fatal(err)
	}
	if conns > 0 {
		cfg.MaxConns = conns
	}
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	var r [6]byte
	_, _ = rand.Read(r[:])
	app := "idem-bench-" + hex.EncodeToString(r[:])
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	shared := pgtest.Pool(b)
	return pool, func() []int {
		rows, err := shared.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
		if err != nil {
			b.Fatal(err)
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			b.Fatal(err)
		}
		out := make([]int, len(pids))
		for i, p := range pids {
			out[i] = int(p)
		}
		return out
	}
}

// backendCPU is the CPU time the backends in after have used since before,
// a backend that started in between counting from zero.
func backendCPU(before, after map[int]time.Duration) time.Duration {
	var d time.Duration
	for pid, t := range after {
		d += t - before[pid]
	}
	return d
}

// simpleNaive is the journal a user writes in an afternoon in front of a
// go-retryablehttp POST, issue #24's baseline: one table (key, request,
// state, response), an autocommitted INSERT of the pending operation
// before the POST and an autocommitted UPDATE with the outcome after it,
// synchronous_commit on (the server's default), pgxpool at its defaults.
// Two round trips, two commits and two WAL flushes per operation, and none
// of idem's fencing, history or status checks.
type simpleNaive struct {
	pool    *pgxpool.Pool
	insert  string
	update  string
	rc      *retryablehttp.Client
	commits atomic.Int64
}

func openSimpleNaive(b *testing.B) opened {
	pool, pids := benchPool(b, 0)
	schema := pgschema.Ident(pgtest.Schema(b))
	table := schema + ".operations"
	if _, err := pool.Exec(context.Background(), `CREATE SCHEMA `+schema+`; CREATE TABLE `+table+` (
		key text PRIMARY KEY,
		request bytea NOT NULL,
		state text NOT NULL,
		response bytea
	)`); err != nil {
		b.Fatal(err)
	}
	n := &simpleNaive{pool: pool,
		insert: `INSERT INTO ` + table + ` (key, request, state) VALUES ($1, $2, 'pending')`,
		update: `UPDATE ` + table + ` SET state = $2, response = $3 WHERE key = $1`,
		rc: &retryablehttp.Client{HTTPClient: &http.Client{Transport: benchTransport(64)},
			RetryMax: 4, CheckRetry: retryablehttp.DefaultRetryPolicy, Backoff: retryablehttp.DefaultBackoff,
			RetryWaitMin: 100 * time.Millisecond, RetryWaitMax: 5 * time.Second},
	}
	return opened{do: n.post, commits: n.commits.Load, pids: pids, simple: n}
}

// post journals the operation as pending under a new key, sends it, and
// records its outcome.
func (n *simpleNaive) post(ctx context.Context, url string, _ int64) error {
	var k [16]byte
	_, _ = rand.Read(k[:])
	key := hex.EncodeToString(k[:])
	if _, err := n.pool.Exec(ctx, n.insert, key, benchBody); err != nil {
		return err
	}
	n.commits.Add(1)
	req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, url, benchBody)
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := n.rc.Do(req)
	state, body := "failed", []byte(nil)
	if err == nil {
		body, err = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusCreated {
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if err == nil {
			state = "succeeded"
		}
	}
	if _, uerr := n.pool.Exec(ctx, n.update, key, state, body); uerr != nil {
		return errors.Join(err, uerr)
	}
	n.commits.Add(1)
	return err
}

func benchDo(b *testing.B, o opened, callers int) {
	srv, posts := fastServer(b)
	do := o.do
	if do == nil {
		tr := benchTransport(callers)
		defer tr.CloseIdleConnections()
		c, err := idem.New(idem.Config{Journal: o.j, BaseURL: srv.URL, Owner: "bench", HTTPClient: &http.Client{Transport: tr}})
		if err != nil {
			b.Fatal(err)
		}
		defer func() {
			if err := c.Close(); err != nil {
				b.Error(err)
			}
		}()
		do = func(ctx context.Context, _ string, i int64) error {
			res, err := c.Do(ctx, idem.Op{ID: "checkout/cart-" + strconv.FormatInt(i, 10), URL: "/orders", Body: benchBody})
			if err == nil && res.StatusCode != http.StatusCreated {
				err = fmt.Errorf("status %d", res.StatusCode)
			}
			return err
		}
	}
	url := srv.URL + "/orders"
	pids := func() []int { return nil }
	if o.pids != nil {
		pids = o.pids
	}
	before := o.commits()
	var (
		next   atomic.Int64
		wg     sync.WaitGroup
		failed atomic.Value
	)
	var wal0 walLSN
	if o.pids != nil {
		wal0 = readWAL(b)
	}
	b.ResetTimer()
	pg0 := benchcpu.Processes(pids())
	cpu0, cpuOK := benchcpu.Process()
	start := time.Now()
	for range callers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := do(context.Background(), url, i); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu1, _ := benchcpu.Process()
	b.StopTimer()
	pg1 := benchcpu.Processes(pids())
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
	if n := posts.Load(); n != int64(b.N) {
		b.Fatalf("%d operations sent %d requests", b.N, n)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	b.ReportMetric(float64(o.commits()-before)/float64(b.N), "commits/op")
	if cpuOK {
		b.ReportMetric(float64(cpu1-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
	}
	if o.pids != nil {
		b.ReportMetric(float64(backendCPU(pg0, pg1))/float64(time.Microsecond)/float64(b.N), "pg-cpu-µs/op")
		b.ReportMetric(float64(readWAL(b)-wal0)/float64(b.N), "wal-B/op")
	}
}

// walLSN is the server's WAL insert position: the WAL written by the
// whole server, every database and session of it, so that the bytes per
// operation are the configuration's own only on a server nobody else
// writes to (point IDEM_TEST_POSTGRES at one: BENCHMARKS.md, "Fourth speed
// session"). pg_stat_wal would also count records and full-page images,
// but backends report to it up to a second late.
type walLSN int64

func readWAL(b *testing.B) walLSN {
	b.Helper()
	var w int64
	err := pgtest.Pool(b).QueryRow(context.Background(),
		`SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`).Scan(&w)
	if err != nil {
		b.Fatal(err)
	}
	return walLSN(w)
}

// The fleet: worker processes resuming operations enqueued in one journal.
const (
	fleetOps         = 2000 // operations per iteration
	fleetConcurrency = 16   // Config.ResumeConcurrency of each worker
	fleetConns       = 8    // each worker's pool
	fleetChild       = "fleet-worker"
)

func init() { children[fleetChild] = fleetWorker }

// fleetWorker is a worker of BenchmarkFleet, in a process of its own: it
// opens the journal on a pool of its own, says "ready", waits for its stdin
// to close, and runs Resume until nothing is left, as a worker of a fleet
// does (examples/fleet, runWorker).
func fleetWorker() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	if err != nil {
		return err
	}
	cfg.MaxConns = fleetConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(os.Getenv("FLEET_SCHEMA")), postgres.WithoutMigration())
	if err != nil {
		return err
	}
	defer j.Close()
	tr := benchTransport(fleetConcurrency)
	defer tr.CloseIdleConnections()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: os.Getenv("FLEET_URL"), Owner: os.Getenv("FLEET_WORKER"),
		ResumeConcurrency: fleetConcurrency, HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := pool.Ping(ctx); err != nil {
		return err
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	rep, err := c.Resume(ctx, idem.ResumeWait())
	fmt.Printf("claimed %d, succeeded %d, left %d\n", rep.Claimed, rep.Succeeded, rep.Remaining())
	return err
}

// fleetProc is a running worker.
type fleetProc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer
	out    string
	err    error
	exited chan struct{}
}

// BenchmarkFleet measures the throughput of a fleet of 1, 2 and 4 worker
// processes on one PostgreSQL journal. Each iteration enqueues fleetOps
// operations with Begin (journaled as pending, not sent) in a fresh schema,
// starts the workers and waits until each has opened its pool, journal and
// client (process start-up is not timed), then lets them go: each runs
// Resume(ResumeWait), claiming, sending and settling operations. The time
// runs until the journal holds no active operation: a worker with
// ResumeWait lingers up to a second after its last claim, watching the
// leases of the others, and that wait is not work. Then every operation
// must have succeeded and been sent exactly once, or the benchmark fails.
//
// It reports ops/s, and commits/op: transactions committed per operation
// by the workers (claims included), counted as BenchmarkDo does.
//
//	go test -run '^$' -bench 'BenchmarkFleet' -benchtime 3x .
func BenchmarkFleet(b *testing.B) {
	for _, workers := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			pool := pgtest.Pool(b)
			srv, posts := fastServer(b)
			var elapsed time.Duration
			var committed int64
			b.StopTimer()
			for range b.N {
				schema := pgtest.Schema(b)
				fleetEnqueue(b, pool, schema, srv.URL)
				sentBefore, commitsBefore := posts.Load(), commits(b, pool, schema)
				procs := make([]*fleetProc, workers)
				for w := range procs {
					procs[w] = startFleetWorker(b, schema, srv.URL, fmt.Sprintf("worker-%d", w+1))
				}
				b.StartTimer()
				start := time.Now()
				for _, p := range procs {
					_ = p.stdin.Close()
				}
				fleetWaitSettled(b, pool, schema, procs)
				elapsed += time.Since(start)
				b.StopTimer()
				for _, p := range procs {
					<-p.exited
					if p.err != nil {
						b.Fatalf("%s: %v\n%s", p.name, p.err, p.stderr.String())
					}
				}
				committed += commits(b, pool, schema) - commitsBefore
				fleetVerify(b, pool, schema)
				if sent := posts.Load() - sentBefore; sent != fleetOps {
					b.Fatalf("%d operations sent %d requests", fleetOps, sent)
				}
			}
			ops := float64(b.N * fleetOps)
			b.ReportMetric(ops/elapsed.Seconds(), "ops/s")
			b.ReportMetric(float64(committed)/ops, "commits/op")
		})
	}
}

// fleetEnqueue journals fleetOps pending operations in schema, from 16
// goroutines.
func fleetEnqueue(b *testing.B, pool *pgxpool.Pool, schema, url string) {
	b.Helper()
	ctx := context.Background()
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema))
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: url, Owner: "enqueuer"})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1); i <= fleetOps; i = next.Add(1) {
				if _, err := c.Begin(ctx, idem.Op{ID: "orders/" + strconv.FormatInt(i, 10), URL: "/orders", Body: benchBody}); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
}

// startFleetWorker starts a worker process and waits until it is ready. It
// is killed when the benchmark ends if it is still running.
func startFleetWorker(b *testing.B, schema, url, name string) *fleetProc {
	b.Helper()
	p := &fleetProc{name: name, exited: make(chan struct{})}
	p.cmd = childCommand(b, fleetChild, "FLEET_SCHEMA="+schema, "FLEET_URL="+url, "FLEET_WORKER="+name)
	p.cmd.Stderr = &p.stderr
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		b.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	ready := make(chan bool, 1)
	go func() {
		defer close(p.exited)
		r := bufio.NewReader(stdout)
		line, _ := r.ReadString('\n')
		ready <- line == "ready\n"
		rest, _ := io.ReadAll(r)
		p.out = string(rest)
		p.err = p.cmd.Wait()
	}()
	b.Cleanup(func() {
		_ = p.stdin.Close()
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	if !<-ready {
		<-p.exited
		b.Fatalf("%s did not start: %v\n%s", name, p.err, p.stderr.String())
	}
	return p
}

// fleetWaitSettled returns when schema's journal holds no active operation,
// looking every 2 ms; it fails the benchmark if a worker fails first.
func fleetWaitSettled(b *testing.B, pool *pgxpool.Pool, schema string, procs []*fleetProc) {
	b.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	q := `SELECT EXISTS (SELECT 1 FROM ` + pgschema.Ident(schema) + `.operations WHERE state IN (1, 2, 3))`
	for {
		var active bool
		if err := pool.QueryRow(ctx, q).Scan(&active); err != nil {
			b.Fatal(err)
		}
		if !active {
			return
		}
		for _, p := range procs {
			select {
			case <-p.exited:
				if p.err != nil {
					b.Fatalf("%s failed: %v\n%s", p.name, p.err, p.stderr.String())
				}
			default:
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("the fleet did not settle its operations within 2 minutes")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// fleetVerify fails the benchmark unless every operation of schema has
// succeeded.
func fleetVerify(b *testing.B, pool *pgxpool.Pool, schema string) {
	b.Helper()
	ctx := context.Background()
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration())
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	counts, err := j.Count(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if len(counts) != 1 || counts[0].State != idem.StateSucceeded || counts[0].N != fleetOps {
		b.Fatalf("after the fleet, the journal holds %+v; want %d succeeded", counts, fleetOps)
	}
}
