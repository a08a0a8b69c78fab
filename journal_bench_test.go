package idem_test

// Journal benchmarks. They never run in a plain `go test`; run them all in
// one process with
//
//	go test -run '^$' -bench 'Fsync|Journal' -benchtime 2s -count 3 .
//
// BENCHMARKS.md records the numbers and the targets they are checked
// against. Every result there is a ratio against a baseline measured in the
// same run (a raw fsync, the journal without group commit, a small journal),
// because the machine's disk and load set the absolute numbers.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	_ "github.com/mattn/go-sqlite3"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/journal"
)

// The operation every benchmark journals: what Client.Do stores for a
// checkout call with a 200-byte JSON body and a 100-byte JSON answer.
const (
	jbScope      = "default"
	jbMethod     = "POST"
	jbURL        = "https://api.example.com/v1/checkout"
	jbOwner      = "bench-worker-1"
	jbBodySize   = 200
	jbAnswerSize = 100
)

var (
	jbBody       = jbBytes(jbBodySize)
	jbAnswer     = jbBytes(jbAnswerSize)
	jbReqHeader  = http.Header{"Content-Type": {"application/json"}}
	jbRespHeader = http.Header{"Content-Type": {"application/json"}}
	jbFP         = idem.Fingerprint(jbMethod, jbURL, jbReqHeader, nil, jbBody)
)

// jbBytes returns n bytes of JSON-looking text.
func jbBytes(n int) []byte {
	b := []byte(`{"cart":"cart-123456","items":[`)
	for len(b) < n {
		b = append(b, `{"sku":"SKU-0001","qty":1},`...)
	}
	b = b[:n]
	b[n-1] = '}'
	return b
}

func jbID(i int) string { return fmt.Sprintf("checkout/cart-%07d", i) }

// jbIntent is the record Client.Do creates before sending: in_flight, leased
// to this worker, first attempt.
func jbIntent(key, id string, now time.Time) idem.Record {
	return idem.Record{
		Key: key, Scope: jbScope, ID: id, Method: jbMethod, URL: jbURL,
		Header: jbReqHeader, Body: jbBody, Fingerprint: jbFP, KeyHeader: "Idempotency-Key",
		State: idem.StateInFlight, Attempts: 1, ExpiresAt: now.Add(24 * time.Hour),
		Lease: idem.Lease{Owner: jbOwner, ExpiresAt: now.Add(30 * time.Second)},
	}
}

// jbOutcome is the update Client.Do makes when the answer is a success.
func jbOutcome(stored idem.Record) idem.Record {
	next := stored
	next.State = idem.StateSucceeded
	next.Response = &idem.Response{StatusCode: http.StatusCreated, Header: jbRespHeader, Body: jbAnswer}
	return next
}

// jbOperation is the client's happy path: a durable Create of the intent,
// then an Update with the outcome, Deferred unless outcome says otherwise.
func jbOperation(ctx context.Context, j idem.Journal, key, id string, outcome idem.Durability) error {
	stored, created, err := j.Create(ctx, jbIntent(key, id, time.Now()))
	if err != nil {
		return err
	}
	if !created {
		return fmt.Errorf("record %s/%s already existed", jbScope, id)
	}
	_, err = j.Update(ctx, jbOutcome(stored), outcome, idem.Event{Kind: idem.EventAnswer})
	return err
}

// jbRun runs b.N operations on j from exactly writers goroutines, which take
// operations from a shared counter until b.N are done. Only the operations
// are timed.
func jbRun(b *testing.B, j idem.Journal, writers int, outcome idem.Durability) {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := jbOperation(ctx, j, uuid.NewString(), jbID(int(i)), outcome); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	b.ResetTimer()
	close(start)
	wg.Wait()
	b.StopTimer()
}

// jbModes are the journal configurations compared.
var jbModes = []struct {
	name    string
	opts    []idem.SQLiteOption
	outcome idem.Durability
}{
	// synchronous=FULL with group commit and the outcome buffered: the
	// default, what Client.Do does.
	{"full", nil, idem.Buffered},
	{"normal", []idem.SQLiteOption{idem.SQLiteSynchronousNormal()}, idem.Buffered},
	// No group commit: every write its own transaction (a buffered outcome
	// is then committed at once, without fsync): one fsync per operation.
	{"full-nobatch", []idem.SQLiteOption{idem.SQLiteMaxBatch(1)}, idem.Buffered},
	// The straightforward journal: every write its own transaction, every
	// transaction fsynced ("one fsync per write"), two per operation.
	{"fsync-per-write", []idem.SQLiteOption{idem.SQLiteMaxBatch(1)}, idem.Durable},
}

// BenchmarkFsync is the physical limit: appending about 200 bytes to a file
// in the directory the journals use and waiting for fsync. It is the
// baseline of the single-writer target.
//
// The others are for analysis only: the cheapest SQLite write there is,
// with and without fsync, and the WAL writes of one operation's commit.
func BenchmarkFsync(b *testing.B) {
	b.Run("write200+fsync", benchWriteFsync)
	// The smallest SQLite write: one 200-byte row into a table with no
	// index, one transaction each, through database/sql and the same
	// driver. It writes one page to the WAL.
	for _, sync := range []string{"full", "normal"} {
		b.Run("sqlite-insert-"+sync, func(b *testing.B) {
			db, err := sql.Open("sqlite3", "file:"+filepath.Join(b.TempDir(), "bare.db")+
				"?_journal_mode=WAL&_synchronous="+strings.ToUpper(sync))
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			db.SetMaxOpenConns(1)
			if _, err := db.Exec(`CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)`); err != nil {
				b.Fatal(err)
			}
			ins, err := db.Prepare(`INSERT INTO t (v) VALUES (?)`)
			if err != nil {
				b.Fatal(err)
			}
			defer ins.Close()
			b.ResetTimer()
			for range b.N {
				if _, err := ins.Exec(jbBody); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
		})
	}
	// What SQLite writes to its WAL for one operation's commit: 7 frames,
	// each a 24-byte header and a 4 KiB page written by separate calls, over
	// a WAL reused in place; then, or not, the fsync.
	for _, sync := range []bool{false, true} {
		name := "wal-7-frames"
		if sync {
			name += "+fsync"
		}
		b.Run(name, func(b *testing.B) {
			f, err := os.OpenFile(filepath.Join(b.TempDir(), "wal"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			const size = 4 << 20 // SQLite's WAL restarts at about this size
			if _, err := f.WriteAt(make([]byte, size), 0); err != nil {
				b.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
			header, page := make([]byte, 24), make([]byte, 4096)
			var off int64
			b.ResetTimer()
			for range b.N {
				for range 7 {
					if off+24+4096 > size {
						off = 0
					}
					if _, err := f.WriteAt(header, off); err != nil {
						b.Fatal(err)
					}
					if _, err := f.WriteAt(page, off+24); err != nil {
						b.Fatal(err)
					}
					off += 24 + 4096
				}
				if sync {
					if err := f.Sync(); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StopTimer()
		})
	}
}

// benchWriteFsync appends 200 bytes to a file in a temporary directory and
// fsyncs it, b.N times: one fsync of the disk the journals use.
func benchWriteFsync(b *testing.B) {
	f, err := os.OpenFile(filepath.Join(b.TempDir(), "fsync"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	chunk := jbBytes(jbBodySize)
	b.ResetTimer()
	for range b.N {
		if _, err := f.Write(chunk); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
}

// BenchmarkJournalOperation measures one operation (durable intent, deferred
// outcome) at 1, 16 and 64 concurrent writers in each journal mode; the
// modes are the inner loop, so that the runs compared with each other run
// back to back. ns/op is wall time divided by operations, so it is the
// inverse of the throughput (reported as ops/s). durable-commits/op and
// deferred-commits/op count transactions per operation: at mode full a
// durable commit is one fsync of the WAL; at mode normal no commit waits
// for fsync and every commit counts as durable.
func BenchmarkJournalOperation(b *testing.B) {
	for _, writers := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			for _, m := range jbModes {
				b.Run(m.name, func(b *testing.B) {
					j, err := idem.OpenSQLite(filepath.Join(b.TempDir(), "journal.db"), m.opts...)
					if err != nil {
						b.Fatal(err)
					}
					defer j.Close()
					before := j.Stats()
					jbRun(b, j, writers, m.outcome)
					st := j.Stats()
					n := float64(b.N)
					b.ReportMetric(n/b.Elapsed().Seconds(), "ops/s")
					b.ReportMetric(float64(st.DurableCommits-before.DurableCommits)/n, "durable-commits/op")
					b.ReportMetric(float64(st.DeferredCommits-before.DeferredCommits)/n, "deferred-commits/op")
				})
			}
		})
	}
}

// jbLookupFixture is a bulk-written journal open for reading, with its keys
// and IDs in record order.
type jbLookupFixture struct {
	j         *idem.SQLiteJournal
	keys, ids []string
}

// BenchmarkJournalLookup measures Get by key and Lookup by (scope, ID) on
// journals of 10k and 1M settled records, for records drawn at random from
// those inserted. Each journal is written in bulk (see jbBulkJournal) once
// per process, when first needed and outside the timer, in a temporary
// directory removed at the end; the sizes are the inner loop, so that the
// runs compared with each other run back to back.
func BenchmarkJournalLookup(b *testing.B) {
	dir, err := os.MkdirTemp("", "idem-bench-lookup-")
	if err != nil {
		b.Fatal(err)
	}
	fixtures := map[int]*jbLookupFixture{}
	b.Cleanup(func() {
		for _, fx := range fixtures {
			_ = fx.j.Close()
		}
		_ = os.RemoveAll(dir)
	})
	fixture := func(b *testing.B, n int) *jbLookupFixture {
		if fx := fixtures[n]; fx != nil {
			return fx
		}
		path := filepath.Join(dir, fmt.Sprintf("journal-%d.db", n))
		start := time.Now()
		keys := jbBulkJournal(b, path, n)
		if fi, err := os.Stat(path); err == nil {
			b.Logf("bulk journal of %d records: %d bytes, written in %s", n, fi.Size(), time.Since(start).Round(time.Millisecond))
		}
		j, err := idem.OpenSQLite(path)
		if err != nil {
			b.Fatal(err)
		}
		fx := &jbLookupFixture{j: j, keys: keys, ids: make([]string, n)}
		fixtures[n] = fx
		for i := range fx.ids {
			fx.ids[i] = jbID(i)
		}
		jbVerifyBulk(b, j, keys)
		return fx
	}
	sizes := []struct {
		name string
		n    int
	}{{"10k", 10_000}, {"1M", 1_000_000}}
	ctx := context.Background()
	b.Run("Get", func(b *testing.B) {
		for _, size := range sizes {
			b.Run("records="+size.name, func(b *testing.B) {
				fx := fixture(b, size.n)
				rng := rand.New(rand.NewPCG(1, uint64(b.N)))
				b.ResetTimer()
				for range b.N {
					i := rng.IntN(len(fx.keys))
					rec, err := fx.j.Get(ctx, fx.keys[i])
					if err != nil || rec.Key != fx.keys[i] {
						b.Fatalf("Get(%s) = %s, %v", fx.keys[i], rec.Key, err)
					}
				}
				b.StopTimer()
			})
		}
	})
	b.Run("Lookup", func(b *testing.B) {
		for _, size := range sizes {
			b.Run("records="+size.name, func(b *testing.B) {
				fx := fixture(b, size.n)
				rng := rand.New(rand.NewPCG(2, uint64(b.N)))
				b.ResetTimer()
				for range b.N {
					i := rng.IntN(len(fx.keys))
					rec, err := fx.j.Lookup(ctx, jbScope, fx.ids[i])
					if err != nil || rec.Key != fx.keys[i] {
						b.Fatalf("Lookup(%s) = %s, %v", fx.ids[i], rec.Key, err)
					}
				}
				b.StopTimer()
			})
		}
	})
}

// jbBulkTime is the creation time of bulk record 0; record i is created i ms
// later.
var jbBulkTime = time.UnixMilli(1_750_000_000_000)

// jbBulkRecord returns bulk record i exactly as Create and a successful
// Update leave it, with its two events, by applying the journal's own rules.
func jbBulkRecord(key string, i int) (idem.Record, []idem.Event, error) {
	now := jbBulkTime.Add(time.Duration(i) * time.Millisecond)
	rec, created, err := journal.NewRecord(jbIntent(key, jbID(i), now), now, 0)
	if err != nil {
		return idem.Record{}, nil, err
	}
	done, settled, err := journal.ApplyUpdate(rec, jbOutcome(rec), now.Add(40*time.Millisecond), idem.Event{Kind: idem.EventAnswer}, nil)
	if err != nil {
		return idem.Record{}, nil, err
	}
	return done, []idem.Event{created, settled}, nil
}

// jbBulkJournal writes a journal of n settled records at path and returns
// their keys, in record order, through the journal's own statements in one
// transaction (idem.ImportForBenchmark).
func jbBulkJournal(b *testing.B, path string, n int) []string {
	b.Helper()
	j, err := idem.OpenSQLite(path)
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, n)
	err = idem.ImportForBenchmark(context.Background(), j, n, func(i int) (idem.Record, []idem.Event, error) {
		keys[i] = uuid.NewString()
		return jbBulkRecord(keys[i], i)
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := j.Close(); err != nil {
		b.Fatal(err)
	}
	db, err := sql.Open("sqlite3", "file:"+path)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	var check string
	if err := db.QueryRow("PRAGMA quick_check").Scan(&check); err != nil || check != "ok" {
		b.Fatalf("quick_check of the bulk journal: %q, %v", check, err)
	}
	return keys
}

// jbVerifyBulk reads a few bulk records back through the journal and checks
// that they are exactly what Create and Update would have stored.
func jbVerifyBulk(b *testing.B, j *idem.SQLiteJournal, keys []string) {
	b.Helper()
	ctx := context.Background()
	for _, i := range []int{0, len(keys) / 3, len(keys) / 2, len(keys) - 1} {
		want, wantEvents, err := jbBulkRecord(keys[i], i)
		if err != nil {
			b.Fatal(err)
		}
		got, err := j.Get(ctx, keys[i])
		if err != nil {
			b.Fatalf("bulk record %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, want) {
			b.Fatalf("bulk record %d reads back as\n%+v\nwant\n%+v", i, got, want)
		}
		byID, err := j.Lookup(ctx, jbScope, jbID(i))
		if err != nil || byID.Key != keys[i] {
			b.Fatalf("Lookup of bulk record %d: %s, %v", i, byID.Key, err)
		}
		history, err := j.History(ctx, keys[i])
		if err != nil || !reflect.DeepEqual(history, wantEvents) {
			b.Fatalf("history of bulk record %d: %+v, %v; want %+v", i, history, err, wantEvents)
		}
	}
	if _, err := j.Get(ctx, uuid.NewString()); !errors.Is(err, idem.ErrNotFound) {
		b.Fatalf("Get of an unknown key: %v, want ErrNotFound", err)
	}
}

// BenchmarkJournalBytesPerRecord journals 20,000 operations through Create
// and Update from 16 writers, closes the journal (which checkpoints the WAL
// into the file) and reports the bytes on disk per record, and the overhead:
// bytes per record less the request body and the response body. One
// iteration is one whole journal; ns/op is the time to write it, in mode
// normal (the file's contents do not depend on the fsync mode).
func BenchmarkJournalBytesPerRecord(b *testing.B) {
	const records, writers = 20_000, 16
	var total float64
	for range b.N {
		path := filepath.Join(b.TempDir(), "journal.db")
		j, err := idem.OpenSQLite(path, idem.SQLiteSynchronousNormal())
		if err != nil {
			b.Fatal(err)
		}
		var next atomic.Int64
		var wg sync.WaitGroup
		for range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1)
					if i > records {
						return
					}
					if err := jbOperation(context.Background(), j, uuid.NewString(), jbID(int(i)), idem.Deferred); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if err := j.Close(); err != nil {
			b.Fatal(err)
		}
		size := int64(0)
		for _, p := range []string{path, path + "-wal"} {
			fi, err := os.Stat(p)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				b.Fatal(err)
			}
			size += fi.Size()
		}
		total += float64(size) / records
	}
	perRecord := total / float64(b.N)
	b.ReportMetric(perRecord, "bytes/record")
	b.ReportMetric(perRecord-jbBodySize-jbAnswerSize, "overhead-bytes/record")
}

// BenchmarkMemoryJournalRead measures the reads of a MemoryJournal's
// settled records, which it keeps packed and unpacks into a fresh Record
// on each read: Get by key, Lookup by ID, and List of the whole journal
// (per record listed), on 10,000 records that Do settled.
//
//	go test -run '^$' -bench 'MemoryJournalRead' -benchmem .
func BenchmarkMemoryJournalRead(b *testing.B) {
	const n = 10_000
	srv := benchServer(b)
	j := idem.NewMemoryJournal()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, HTTPClient: &http.Client{Transport: speedTransport()}})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if err := spread(n, 16, func(i int64) error {
		_, err := c.Do(ctx, idem.Op{ID: jbID(int(i - 1)), URL: "/orders", Header: speedHeader, Body: speedBody})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	var keys []string
	for rec, err := range j.List(ctx, idem.Filter{}) {
		if err != nil {
			b.Fatal(err)
		}
		keys = append(keys, rec.Key)
	}
	b.Run("Get", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			if _, err := j.Get(ctx, keys[i%n]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Lookup", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			if _, err := j.Lookup(ctx, "default", jbID(i%n)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("List", func(b *testing.B) {
		b.ReportAllocs()
		listed := 0
		for range b.N {
			for _, err := range j.List(ctx, idem.Filter{}) {
				if err != nil {
					b.Fatal(err)
				}
				listed++
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(listed), "ns/record")
	})
}
