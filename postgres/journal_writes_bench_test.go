package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/benchcpu"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// recordingJournal keeps the first Create's record and the first Update's
// record, durability and event that a Do makes, for BenchmarkWrites to
// replay.
type recordingJournal struct {
	idem.Journal
	mu      sync.Mutex
	created idem.Record
	updated idem.Record
	dur     idem.Durability
	why     idem.Event
}

func (r *recordingJournal) Create(ctx context.Context, rec idem.Record) (idem.Record, bool, error) {
	r.mu.Lock()
	if r.created.Key == "" {
		r.created = rec
	}
	r.mu.Unlock()
	return r.Journal.Create(ctx, rec)
}

func (r *recordingJournal) Update(ctx context.Context, rec idem.Record, d idem.Durability, why idem.Event) (idem.Record, error) {
	r.mu.Lock()
	if r.updated.Key == "" {
		r.updated, r.dur, r.why = rec, d, why
	}
	r.mu.Unlock()
	return r.Journal.Update(ctx, rec, d, why)
}

// BenchmarkWrites measures the journal's part of a Do at one caller, without
// the client and its HTTP exchange: the Create and the Update that settles
// it, as BenchmarkDo's Do makes them (recorded from one), each iteration on
// a new operation; against the simple naive journal's two statements (see
// simpleNaive), each with the response body the settle writes. It reports,
// per pair of writes, the process's CPU, its backends' (pg-cpu-µs/op), and
// the server's WAL, as BenchmarkDo does, so that a change of the journal's
// write path or schema is measured without the client's noise around it.
//
//	go test -run '^$' -bench 'BenchmarkWrites$' -benchtime 4000x .
func BenchmarkWrites(b *testing.B) {
	b.Run("journal=postgres", func(b *testing.B) {
		pair, pids := idemWrites(b)
		measureWrites(b, pids, pair)
	})
	b.Run("journal=postgres-simple", func(b *testing.B) {
		pair, pids := simpleWrites(b)
		measureWrites(b, pids, pair)
	})
	b.Run("journal=postgres-floor", func(b *testing.B) {
		pair, pids := floorWrites(b, floorParts{})
		measureWrites(b, pids, pair)
	})
}

// idemWrites opens the PostgreSQL journal on a pool of its own and returns
// BenchmarkWrites' pair of writes on it (the Create and the settling
// Update of a Do, recorded from one), and the pids of its backends.
func idemWrites(b *testing.B) (func(i int) error, func() []int) {
	pool, pids := benchPool(b, 32)
	j, err := postgres.OpenJournal(context.Background(), pool, postgres.Schema(pgtest.Schema(b)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = j.Close() })
	rj := &recordingJournal{Journal: j}
	srv, _ := fastServer(b)
	c, err := idem.New(idem.Config{Journal: rj, BaseURL: srv.URL, Owner: "bench", HTTPClient: &http.Client{Transport: benchTransport(1)}})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.Do(context.Background(), idem.Op{ID: "checkout/cart-0", URL: "/orders", Body: benchBody}); err != nil {
		b.Fatal(err)
	}
	if err := c.Close(); err != nil {
		b.Fatal(err)
	}
	created, updated := rj.created, rj.updated
	lease := created.Lease.ExpiresAt.Sub(created.UpdatedAt)
	ctx := context.Background()
	return func(i int) error {
		rec := created
		// Unique across the benchmark's runs (b.N = 1 first, then b.N).
		rec.ID = "checkout/w-" + strconv.Itoa(i+1) + "-" + newKey()[:8]
		rec.Key = newKey()
		rec.Lease.ExpiresAt = time.Now().Add(lease) // as the client sets it, from now
		got, _, err := j.Create(ctx, rec)
		if err != nil {
			return err
		}
		next := updated
		next.Key, next.ID, next.Scope = got.Key, got.ID, got.Scope
		next.Version, next.Lease, next.CreatedAt = got.Version, got.Lease, got.CreatedAt
		_, err = j.Update(ctx, next, rj.dur, rj.why)
		return err
	}, pids
}

// simpleWrites opens the simple naive journal and returns its pair of
// writes, each with the response body the settle writes, and its
// backends' pids.
func simpleWrites(b *testing.B) (func(i int) error, func() []int) {
	o := openSimpleNaive(b)
	n := o.simple
	ctx := context.Background()
	return func(int) error {
		key := newKey()
		if _, err := n.pool.Exec(ctx, n.insert, key, benchBody); err != nil {
			return err
		}
		_, err := n.pool.Exec(ctx, n.update, key, "succeeded", floorResponse.body)
		return err
	}, o.pids
}

// floorResponse is the response the floor's settle writes in
// BenchmarkWrites: fastServer's answer, its header included.
var floorResponse = struct {
	header http.Header
	body   []byte
}{http.Header{"Content-Type": {"application/json"}, "Content-Length": {"41"}, "Date": {"Thu, 03 Dec 2026 08:00:00 GMT"}},
	[]byte(`{"order_id":"ord_123","status":"created"}`)}

// floorWrites opens the contract floor (without parts) and returns its
// pair of writes, the create and the settle, and its backends' pids.
func floorWrites(b *testing.B, parts floorParts) (func(i int) error, func() []int) {
	f, o := openContractFloor(b, parts)
	ctx := context.Background()
	url := "http://127.0.0.1:1/orders"
	return func(i int) error {
		key := newKey()
		if err := f.begin(ctx, key, "bench", "checkout/w-"+strconv.Itoa(i+1)+"-"+key[:8], http.MethodPost, url, nil, benchBody); err != nil {
			return err
		}
		return f.finish(ctx, key, f.owner, 1, 4, http.StatusCreated, floorResponse.header, floorResponse.body)
	}, o.pids
}

func newKey() string {
	var k [16]byte
	_, _ = rand.Read(k[:])
	return hex.EncodeToString(k[:])
}

// measureWrites runs pair(0) … pair(b.N-1) and reports CPU, the backends'
// CPU and WAL per pair.
func measureWrites(b *testing.B, pids func() []int, pair func(i int) error) {
	if err := pair(-1); err != nil { // a first statement of each kind, prepared on its connection
		b.Fatal(err)
	}
	wal0 := readWAL(b)
	b.ReportAllocs()
	b.ResetTimer()
	pg0 := benchcpu.Processes(pids())
	cpu0, cpuOK := benchcpu.Process()
	for i := range b.N {
		if err := pair(i); err != nil {
			b.Fatal(err)
		}
	}
	cpu1, _ := benchcpu.Process()
	b.StopTimer()
	pg1 := benchcpu.Processes(pids())
	if cpuOK {
		b.ReportMetric(float64(cpu1-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
	}
	b.ReportMetric(float64(backendCPU(pg0, pg1))/float64(time.Microsecond)/float64(b.N), "pg-cpu-µs/op")
	b.ReportMetric(float64(readWAL(b)-wal0)/float64(b.N), "wal-B/op")
}
