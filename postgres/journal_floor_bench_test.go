package postgres_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/benchcpu"
	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// contractFloor is BenchmarkDo's third PostgreSQL baseline (issue #24): the
// cheapest journal that still keeps what DESIGN.md asks of a journaled
// call, written by hand as well as one can, in front of the same plain
// go-retryablehttp POST as the simple naive journal (simpleNaive). It
// keeps what that one does not:
//
//   - the intent, whole, durable before the send: key, scope, operation
//     id, method, URL, header, body and a fingerprint of the request
//     (SHA-256, 32 bytes), inserted directly in flight, autocommitted at
//     synchronous_commit on, which the pool sets on each of its sessions
//     at start-up (a startup parameter overrides the database's and the
//     role's defaults, at no cost per statement);
//   - the key unique (the primary key) and the operation found by
//     (scope, op_id), unique: a second Do of the same operation fails the
//     insert and reads the row (not on the path measured);
//   - a lease, owner, epoch and expiry on the server's clock, taken with
//     the insert; a worker that takes an operation over raises its epoch
//     (takeOver), and the settle is fenced by owner and epoch, so a
//     taken-over worker's late settle writes nothing;
//   - the settle, state and response (status, header, body), one UPDATE
//     that drops the lease, committed without waiting for its WAL flush as
//     idem's settle is (Deferred: set_config of the transaction's
//     synchronous_commit, in the statement).
//
// Two statements per operation, prepared (pgx's default statement cache),
// on pgxpool's defaults. It keeps no history, no due queue (a worker finds
// an abandoned operation by scanning the table for lapsed leases, a cost
// moved off the path measured, not removed), no attempt counts, versions
// or retention, no status checks and no group commit: what it costs is
// what the contract's durable intent, uniqueness and fence cost at the
// least. floorParts changes it a part at a time, to price each of its
// parts and each of what idem's journal adds (BenchmarkFloorParts).
type contractFloor struct {
	pool    *pgxpool.Pool
	table   string
	create  string
	settle  string
	take    string
	owner   string
	parts   floorParts
	dueAt   int64 // with due: when the last operation begun is due (one caller at a time)
	rc      *retryablehttp.Client
	commits atomic.Int64
}

// floorParts are changes to the contract floor that BenchmarkFloorParts
// makes one at a time, to price each part of it (the no fields: what it
// keeps beyond the simple naive journal) and each of what idem's journal
// does beyond it (the others); the zero value is the floor.
type floorParts struct {
	noOpIndex     bool // no UNIQUE (scope, op_id): the operation not found by its name
	noLease       bool // no lease columns and no fence on the settle
	noIntent      bool // the request as the simple journal keeps it: no method, URL, header or fingerprint
	durableSettle bool // the settle waits for its WAL flush (no set_config: the session's level, on)
	levelCreate   bool // the create sets its level too, as idem's does (set_config of commitDurable's form)
	due           bool // idem's due queue: a row inserted with the create, deleted by the settle, in their statements
	leaseIndex    bool // the other way to find lapsed leases without a scan: a partial index of the operations in flight by expiry
	id            bool // an identity primary key beside the key's unique index, as idem's table has
	width         bool // idem's row: its other 24 columns, 11 more parameters a write, fill factor 50
}

// errFenced is a settle the floor refused: the operation is no longer
// the writer's (another worker took it over, or it is settled).
var errFenced = errors.New("contract floor: the lease was taken over")

// floorLease is how long the floor's lease runs.
const floorLease = 30 * time.Second

// newContractFloor makes the floor's table in a new schema of pool's
// database, with leases lasting lease.
func newContractFloor(tb testing.TB, pool *pgxpool.Pool, parts floorParts, lease time.Duration) *contractFloor {
	tb.Helper()
	schema := pgschema.Ident(pgtest.Schema(tb))
	table := schema + ".operations"
	var cols []string
	if parts.id {
		cols = append(cols, "id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY", "key text NOT NULL UNIQUE")
	} else {
		cols = append(cols, "key text PRIMARY KEY")
	}
	cols = append(cols, "scope text NOT NULL", "op_id text NOT NULL")
	if !parts.noIntent {
		cols = append(cols, "method text NOT NULL", "url text NOT NULL", "header bytea", "body bytea NOT NULL",
			"fingerprint bytea NOT NULL")
	} else {
		cols = append(cols, "body bytea NOT NULL")
	}
	cols = append(cols, "state smallint NOT NULL")
	if !parts.noLease {
		cols = append(cols, "lease_owner text", "lease_epoch bigint NOT NULL", "lease_expires_at timestamptz")
	}
	cols = append(cols, "resp_status integer", "resp_header bytea", "resp_body bytea")
	if parts.width {
		cols = append(cols, "key_header text", "key_quoted boolean NOT NULL DEFAULT false", "resends integer NOT NULL",
			"attempts integer NOT NULL", "next_attempt_at bigint NOT NULL", "resp_replayed boolean", "last_error text",
			"note text", "created_at bigint NOT NULL", "updated_at bigint NOT NULL", "expires_at bigint",
			"version bigint NOT NULL", "link text", "ev_at bigint", "ev_kind smallint", "ev_detail text",
			"ev_from smallint", "ev_error text", "ev_owner text", "cr_at bigint", "cr_kind smallint", "cr_from smallint",
			"cr_state smallint", "cr_owner text")
	}
	if !parts.noOpIndex {
		cols = append(cols, "UNIQUE (scope, op_id)")
	}
	ddl := `CREATE SCHEMA ` + schema + `; CREATE TABLE ` + table + ` (
		` + strings.Join(cols, ",\n\t\t") + `)`
	if parts.width {
		ddl += ` WITH (fillfactor = 50)`
	}
	if parts.leaseIndex {
		// The settle changes state, in the predicate: it is never HOT.
		ddl += `; CREATE INDEX ON ` + table + ` (lease_expires_at) WHERE state = 2`
	}
	if parts.due {
		ddl += `; CREATE TABLE ` + schema + `.due (next_attempt_at bigint NOT NULL, key text NOT NULL,
			PRIMARY KEY (next_attempt_at, key))`
	}
	if _, err := pool.Exec(context.Background(), ddl); err != nil {
		tb.Fatal(err)
	}
	f := &contractFloor{pool: pool, table: table, owner: "worker-1", parts: parts,
		rc: &retryablehttp.Client{HTTPClient: &http.Client{Transport: benchTransport(64)},
			RetryMax: 4, CheckRetry: retryablehttp.DefaultRetryPolicy, Backoff: retryablehttp.DefaultBackoff,
			RetryWaitMin: 100 * time.Millisecond, RetryWaitMax: 5 * time.Second},
	}
	expiry := `statement_timestamp() + interval '` + strconv.FormatInt(lease.Milliseconds(), 10) + ` milliseconds'`

	// The create's columns and values, in the order of begin's arguments
	// ($n: the next one). State 2 is in flight (idem.StateInFlight): the
	// operation is created as it is sent, as idem's Do creates it.
	n := 0
	param := func() string { n++; return "$" + strconv.Itoa(n) }
	var names, values []string
	set := func(name, value string) { names, values = append(names, name), append(values, value) }
	set("key", param())
	set("scope", param())
	set("op_id", param())
	if !parts.noIntent {
		for _, c := range []string{"method", "url", "header", "body", "fingerprint"} {
			set(c, param())
		}
	} else {
		set("body", param())
	}
	set("state", "2")
	if !parts.noLease {
		set("lease_owner", param())
		set("lease_epoch", "1")
		set("lease_expires_at", expiry)
	}
	if parts.width {
		for _, c := range []string{"resends", "attempts", "next_attempt_at", "created_at", "updated_at", "expires_at",
			"version", "ev_at", "ev_kind", "ev_detail", "ev_owner"} {
			set(c, param())
		}
	}
	ins := `INSERT INTO ` + table + ` (` + strings.Join(names, ", ") + `) VALUES (` + strings.Join(values, ", ") + `)`
	// With due or its own level, the create is idem's form: the insert in
	// a CTE, the level joined to the statement's SELECT.
	if parts.due || parts.levelCreate {
		ret := `key`
		if parts.due {
			ret += `, ` + "$" + strconv.Itoa(n+1) + `::bigint AS next`
			if parts.width {
				ret = `key, next_attempt_at AS next`
			}
		}
		ins = `WITH ins AS (` + ins + ` RETURNING ` + ret + `)`
		if parts.due {
			ins += `, d AS (INSERT INTO ` + schema + `.due (next_attempt_at, key) SELECT next, key FROM ins)`
		}
		ins += ` SELECT 1 FROM ins`
		if parts.levelCreate {
			ins += `, (SELECT set_config('synchronous_commit',
			CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true)) lvl`
		}
	}
	f.create = ins

	// The settle: $1 the key, then the fence's owner and epoch, then the
	// state and the response.
	n = 0
	key := param()
	var fence string
	if !parts.noLease {
		fence = ` AND lease_owner = ` + param() + ` AND lease_epoch = ` + param()
	} else {
		fence = ` AND state = 2`
	}
	sets := []string{"state = " + param(), "resp_status = " + param(), "resp_header = " + param(), "resp_body = " + param()}
	if !parts.noLease {
		sets = append(sets, "lease_owner = NULL", "lease_expires_at = NULL")
	}
	if parts.width {
		for _, c := range []string{"attempts", "next_attempt_at", "resp_replayed", "last_error", "note", "updated_at",
			"expires_at", "version", "ev_at", "ev_kind", "ev_from"} {
			sets = append(sets, c+" = "+param())
		}
		sets = append(sets, "cr_at = ev_at", "cr_kind = ev_kind", "cr_from = ev_from", "cr_state = state", "cr_owner = ev_owner")
	}
	upd := `UPDATE ` + table + ` SET ` + strings.Join(sets, ", ")
	if !parts.durableSettle {
		upd += ` FROM (SELECT set_config('synchronous_commit', 'off', true)) lvl`
	}
	upd += ` WHERE key = ` + key + fence
	if parts.due {
		upd = `WITH u AS (` + upd + ` RETURNING key)
		DELETE FROM ` + schema + `.due WHERE next_attempt_at = ` + param() + ` AND key = ` + key + ` AND EXISTS (SELECT FROM u)`
	}
	f.settle = upd
	// A worker takes over an operation in flight whose lease has lapsed,
	// by the server's clock, under a new epoch.
	f.take = `UPDATE ` + table + ` SET lease_owner = $2, lease_epoch = lease_epoch + 1,
		lease_expires_at = ` + expiry + `
		WHERE key = $1 AND state = 2 AND lease_expires_at <= statement_timestamp() RETURNING lease_epoch`
	return f
}

// openContractFloor is the floor as BenchmarkDo runs it: on a pool of its
// own at pgxpool's defaults, its sessions at synchronous_commit on.
func openContractFloor(b *testing.B, parts floorParts) (*contractFloor, opened) {
	pool, pids := floorPool(b)
	f := newContractFloor(b, pool, parts, floorLease)
	return f, opened{do: f.post, commits: f.commits.Load, pids: pids}
}

// floorPool is benchPool at pgxpool's defaults, whose sessions start at
// synchronous_commit on.
func floorPool(b *testing.B) (*pgxpool.Pool, func() []int) {
	b.Helper()
	return benchPoolWith(b, 0, map[string]string{"synchronous_commit": "on"})
}

// fingerprint is the request's SHA-256, its fields each followed by a
// zero byte.
func fingerprint(method, url string, header, body []byte) []byte {
	h := sha256.New()
	for _, f := range [...][]byte{[]byte(method), []byte(url), header, body} {
		h.Write(f)
		h.Write([]byte{0})
	}
	return h.Sum(nil)
}

// begin journals the operation scope/opID under key, in flight, leased to
// the floor's owner at epoch 1.
func (f *contractFloor) begin(ctx context.Context, key, scope, opID, method, url string, header http.Header, body []byte) error {
	args := make([]any, 0, 24)
	args = append(args, key, scope, opID)
	if !f.parts.noIntent {
		var h []byte
		if len(header) > 0 {
			h = wire.EncodeHeader(header)
		}
		args = append(args, method, url, h, body, fingerprint(method, url, h, body))
	} else {
		args = append(args, body)
	}
	if !f.parts.noLease {
		args = append(args, f.owner)
	}
	now := time.Now().UnixMilli()
	f.dueAt = now + 30_000
	if f.parts.width {
		// resends, attempts, next_attempt_at, created_at, updated_at,
		// expires_at, version, ev_at, ev_kind, ev_detail, ev_owner
		args = append(args, int32(0), int32(1), f.dueAt, now, now, now+86_400_000, int64(1), now, int16(1), nil, f.owner)
	}
	if f.parts.due && !f.parts.width {
		args = append(args, f.dueAt)
	}
	_, err := f.pool.Exec(ctx, f.create, args...)
	if err == nil {
		f.commits.Add(1)
	}
	return err
}

// finish settles the operation key, held by owner at epoch, with its
// state and response; errFenced when the lease is no longer theirs.
func (f *contractFloor) finish(ctx context.Context, key, owner string, epoch int64, state int16, status int, header http.Header, body []byte) error {
	var h []byte
	if header != nil {
		h = wire.EncodeHeader(header)
	}
	var st any
	if status != 0 {
		st = int32(status)
	}
	args := make([]any, 0, 20)
	args = append(args, key)
	if !f.parts.noLease {
		args = append(args, owner, epoch)
	}
	args = append(args, state, st, h, body)
	now := time.Now().UnixMilli()
	if f.parts.width {
		// attempts, next_attempt_at, resp_replayed, last_error, note,
		// updated_at, expires_at, version, ev_at, ev_kind, ev_from
		args = append(args, int32(1), now, false, nil, nil, now, now+86_400_000, int64(2), now, int16(3), int16(2))
	}
	if f.parts.due {
		// The time the operation was due at, which its writer knows.
		args = append(args, f.dueAt)
	}
	tag, err := f.pool.Exec(ctx, f.settle, args...)
	if err != nil {
		return err
	}
	f.commits.Add(1)
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %s", errFenced, key)
	}
	return nil
}

// takeOver gives an operation in flight whose lease has lapsed to owner,
// and returns its new epoch.
func (f *contractFloor) takeOver(ctx context.Context, key, owner string) (int64, error) {
	var epoch int64
	err := f.pool.QueryRow(ctx, f.take, key, owner).Scan(&epoch)
	return epoch, err
}

// post is BenchmarkDo's operation on the floor: journal the intent, send
// it with its key, settle it.
func (f *contractFloor) post(ctx context.Context, url string, i int64) error {
	key := newKey()
	if err := f.begin(ctx, key, "bench", "checkout/cart-"+strconv.FormatInt(i, 10), http.MethodPost, url, nil, benchBody); err != nil {
		return err
	}
	req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, url, benchBody)
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := f.rc.Do(req)
	// Not sent, or no answer: the operation stays in flight, for a status
	// check (not part of the floor).
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return err
	}
	state := int16(4) // succeeded
	if resp.StatusCode >= 400 {
		state = 5 // rejected
	}
	if err := f.finish(ctx, key, f.owner, 1, state, resp.StatusCode, resp.Header, body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// The floor keeps what it is there to price: the same operation cannot be
// journaled twice, and a worker whose lease was taken over cannot settle.
func TestContractFloorKeepsTheContract(t *testing.T) {
	ctx := context.Background()
	f := newContractFloor(t, pgtest.Pool(t), floorParts{}, 0) // leases lapse at once
	if err := f.begin(ctx, "k1", "s", "op-1", "POST", "http://x/orders", nil, benchBody); err != nil {
		t.Fatal(err)
	}
	if err := f.begin(ctx, "k2", "s", "op-1", "POST", "http://x/orders", nil, benchBody); err == nil {
		t.Fatal("a second key for the same operation was journaled")
	}
	if err := f.begin(ctx, "k1", "s", "op-2", "POST", "http://x/orders", nil, benchBody); err == nil {
		t.Fatal("a second operation under the same key was journaled")
	}
	epoch, err := f.takeOver(ctx, "k1", "worker-2")
	if err != nil {
		t.Fatal(err)
	}
	if epoch != 2 {
		t.Fatalf("taken over at epoch %d, want 2", epoch)
	}
	if err := f.finish(ctx, "k1", f.owner, 1, 4, 201, nil, []byte("late")); !errors.Is(err, errFenced) {
		t.Fatalf("the taken-over worker's settle: %v, want errFenced", err)
	}
	if err := f.finish(ctx, "k1", "worker-2", epoch, 4, 201, http.Header{"A": {"b"}}, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	var state int16
	var body []byte
	var owner *string
	if err := f.pool.QueryRow(ctx, `SELECT state, resp_body, lease_owner FROM `+f.table+` WHERE key = 'k1'`).Scan(&state, &body, &owner); err != nil {
		t.Fatal(err)
	}
	if state != 4 || string(body) != "ok" || owner != nil {
		t.Fatalf("settled row: state %d, body %q, owner %v", state, body, owner)
	}
	if err := f.finish(ctx, "k1", "worker-2", epoch, 4, 201, nil, []byte("again")); !errors.Is(err, errFenced) {
		t.Fatalf("a settle after the settle: %v, want errFenced", err)
	}
}

// BenchmarkFloorParts prices each part of the contract floor, and compares
// the floor with idem's journal and the simple naive journal, in one
// process: the pair of writes of each (see BenchmarkWrites), each on a
// pool of its own, in rounds of floorRound pairs that alternate between
// them, so that the machine's load falls on all of them alike. It
// reports, for each, the medians over the rounds of the process's CPU per
// pair, its backends' and their sum (see pairedRounds); b.N is the number
// of rounds.
//
//	go test -run '^$' -bench 'BenchmarkFloorParts$' -benchtime 30x .
func BenchmarkFloorParts(b *testing.B) {
	var vs []*pairedVariant
	add := func(name string, pair func(i int) error, pids func() []int) {
		vs = append(vs, &pairedVariant{name: name, run: pair, pids: pids})
	}
	pair, pids := idemWrites(b)
	add("idem", pair, pids)
	pair, pids = simpleWrites(b)
	add("simple", pair, pids)
	for _, p := range []struct {
		name  string
		parts floorParts
	}{
		{"floor", floorParts{}},
		{"floor-no-opindex", floorParts{noOpIndex: true}},
		{"floor-no-lease", floorParts{noLease: true}},
		{"floor-no-intent", floorParts{noIntent: true}},
		{"floor-no-all3", floorParts{noOpIndex: true, noLease: true, noIntent: true}},
		{"floor-durable-settle", floorParts{durableSettle: true}},
		{"floor+level", floorParts{levelCreate: true}},
		{"floor+due", floorParts{due: true}},
		{"floor+leaseindex", floorParts{leaseIndex: true}},
		{"floor+id", floorParts{id: true}},
		{"floor+width", floorParts{width: true}},
		{"floor+all4", floorParts{levelCreate: true, due: true, id: true, width: true}},
	} {
		pair, pids = floorWrites(b, p.parts)
		add(p.name, pair, pids)
	}
	pairedRounds(b, vs, "pair")
}

// BenchmarkDoPaired is BenchmarkDo at one caller for idem's PostgreSQL
// journal, the simple naive journal and the contract floor, without and
// with a due queue or an index of leases (floorParts.due, leaseIndex: what
// lets a worker find another's abandoned operations without a scan), in one
// process, in alternating rounds of floorRound operations (see
// BenchmarkFloorParts): the medians over the rounds of each one's process
// CPU, backends' CPU and their sum per operation, of its ops/s, and of the
// per-round ratios of its sum and its ops/s to the simple journal's. b.N
// is the number of rounds.
//
//	go test -run '^$' -bench 'BenchmarkDoPaired$' -benchtime 40x .
func BenchmarkDoPaired(b *testing.B) {
	srv, _ := fastServer(b)
	url := srv.URL + "/orders"
	var vs []*pairedVariant
	{
		pool, pids := benchPool(b, 32)
		j, err := postgres.OpenJournal(context.Background(), pool, postgres.Schema(pgtest.Schema(b)))
		if err != nil {
			b.Fatal(err)
		}
		tr := benchTransport(1)
		c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Owner: "bench", HTTPClient: &http.Client{Transport: tr}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if err := c.Close(); err != nil {
				b.Error(err)
			}
			_ = j.Close()
			tr.CloseIdleConnections()
		})
		vs = append(vs, &pairedVariant{name: "idem", pids: pids, run: func(i int) error {
			res, err := c.Do(context.Background(), idem.Op{ID: "checkout/cart-" + strconv.Itoa(i), URL: "/orders", Body: benchBody})
			if err == nil && res.StatusCode != http.StatusCreated {
				err = fmt.Errorf("status %d", res.StatusCode)
			}
			return err
		}})
	}
	for _, o := range []struct {
		name string
		opened
	}{
		{"simple", openSimpleNaive(b)},
		{"floor", func() opened { _, o := openContractFloor(b, floorParts{}); return o }()},
		{"floor+due", func() opened { _, o := openContractFloor(b, floorParts{due: true}); return o }()},
		{"floor+leaseindex", func() opened { _, o := openContractFloor(b, floorParts{leaseIndex: true}); return o }()},
	} {
		vs = append(vs, &pairedVariant{name: o.name, pids: o.pids, run: func(i int) error { return o.do(context.Background(), url, int64(i)) }})
	}
	pairedRounds(b, vs, "op")
}

// pairedVariant is one configuration of pairedRounds: run(i) does its i-th
// unit of work (i unique in the process).
type pairedVariant struct {
	name                 string
	run                  func(i int) error
	pids                 func() []int
	cpu, pg, sum, perSec []float64
}

// pairedRounds runs b.N rounds of floorRound units of each variant's, the
// variants in turn, each round beginning with another, and reports the
// medians over the rounds of each one's process CPU (cpu-µs/unit), its
// backends' (pg-µs/unit, from /proc/<pid>/schedstat), their sum
// (sum-µs/unit) and its units per second; and, when a variant is named
// simple, the medians of each other one's per-round ratios of sum and of
// units per second to simple's in the same round.
func pairedRounds(b *testing.B, vs []*pairedVariant, unit string) {
	n := 0
	for _, v := range vs { // each statement prepared on its connection
		for range 20 {
			if err := v.run(n); err != nil {
				b.Fatal(err)
			}
			n++
		}
	}
	b.ResetTimer()
	for round := range b.N {
		for k := range vs {
			v := vs[(round+k)%len(vs)]
			pg0 := schedCPU(v.pids())
			cpu0, _ := benchcpu.Process()
			start := time.Now()
			for range floorRound {
				if err := v.run(n); err != nil {
					b.Fatal(err)
				}
				n++
			}
			elapsed := time.Since(start)
			cpu1, _ := benchcpu.Process()
			pg1 := schedCPU(v.pids())
			cpu := float64(cpu1-cpu0) / float64(time.Microsecond) / floorRound
			pg := float64(backendCPU(pg0, pg1)) / float64(time.Microsecond) / floorRound
			v.cpu, v.pg, v.sum = append(v.cpu, cpu), append(v.pg, pg), append(v.sum, cpu+pg)
			v.perSec = append(v.perSec, floorRound/elapsed.Seconds())
		}
	}
	b.StopTimer()
	var simple *pairedVariant
	for _, v := range vs {
		if v.name == "simple" {
			simple = v
		}
	}
	for _, v := range vs {
		b.ReportMetric(median(v.cpu), v.name+"-cpu-µs/"+unit)
		b.ReportMetric(median(v.pg), v.name+"-pg-µs/"+unit)
		b.ReportMetric(median(v.sum), v.name+"-sum-µs/"+unit)
		b.ReportMetric(median(v.perSec), v.name+"-"+unit+"s/s")
		if simple != nil && v != simple {
			cpuRatio, rateRatio := make([]float64, b.N), make([]float64, b.N)
			for r := range b.N {
				cpuRatio[r], rateRatio[r] = v.sum[r]/simple.sum[r], v.perSec[r]/simple.perSec[r]
			}
			b.ReportMetric(median(cpuRatio), v.name+"/simple-cpu")
			b.ReportMetric(median(rateRatio), v.name+"/simple-"+unit+"s/s")
		}
	}
}

// floorRound is the units of work of a variant in a round of pairedRounds.
const floorRound = 100

// schedCPU is the time on CPU of each of pids, from /proc/<pid>/schedstat
// (nanoseconds, where /proc/<pid>/stat counts 10 ms ticks).
func schedCPU(pids []int) map[int]time.Duration {
	out := make(map[int]time.Duration, len(pids))
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/schedstat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		out[pid] = time.Duration(ns)
	}
	return out
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
