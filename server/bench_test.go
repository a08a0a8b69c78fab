package server_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/benchcpu"
	"github.com/idemkit/idem/server"
)

// BenchmarkMiddleware measures requests per second of a trivial handler
// through a real loopback server: without the middleware, and with it on
// each store. Every request carries a new key, so each one claims, runs and
// completes (the cost of a first request, not of a replay).
//
// Each configuration with the middleware is measured against the plain
// handler in the same benchmark, in alternating rounds (about 20 of each,
// the same number of requests in every round), so that a machine whose
// load changes during the run slows both sides alike: x-none is the
// configuration's req/s divided by the plain handler's over those rounds,
// cpu-x-none the plain handler's CPU time per request divided by the
// configuration's (what x-none tends to when both are bound by the CPU,
// and steadier when other processes take it).
// req/s, cpu-µs/req (the CPU time of the whole process, client and server,
// per request), B/req and allocs/req (the process's, the loopback client's
// included) are the configuration's own rounds only.
//
//	go test -run '^$' -bench BenchmarkMiddleware -benchtime 3s -count 3 ./server
func BenchmarkMiddleware(b *testing.B) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"order_id":"ord_1"}`))
	})
	b.Run("none", func(b *testing.B) { benchServer(b, handler, nil) })
	b.Run("memory", func(b *testing.B) {
		benchServer(b, withMiddleware(b, server.NewMemoryStore(), handler), handler)
	})
	b.Run("sqlite", func(b *testing.B) {
		benchServer(b, withMiddleware(b, benchSQLite(b), handler), handler)
	})
	b.Run("sqlite-deferred-completes", func(b *testing.B) {
		benchServer(b, withMiddleware(b, benchSQLite(b, server.SQLiteDeferCompletes()), handler), handler)
	})
}

func benchSQLite(b *testing.B, opts ...server.SQLiteOption) server.Store {
	s, err := server.OpenSQLiteStore(filepath.Join(b.TempDir(), "keys.db"), opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

func withMiddleware(b *testing.B, store server.Store, h http.Handler, mod ...func(*server.Config)) http.Handler {
	cfg := server.Config{Store: store, Scope: server.SingleTenant}
	for _, m := range mod {
		m(&cfg)
	}
	mw, err := server.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = mw.Close() })
	return mw.Handler(h)
}

// benchClients is the number of concurrent clients: a server has many at
// once, and 32 lets group commit share fsyncs as it would in production.
const benchClients = 32

// benchRounds is the number of rounds of each side when a configuration is
// compared with the plain handler.
const benchRounds = 20

// benchTarget is one loopback server and its clients' transport.
type benchTarget struct {
	srv    *httptest.Server
	client *http.Client
	next   *atomic.Int64 // the last key sent, shared by every target
}

func newBenchTarget(h http.Handler, next *atomic.Int64) *benchTarget {
	srv := httptest.NewServer(h)
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = 256
	return &benchTarget{srv: srv, client: client, next: next}
}

// run sends n requests from benchClients goroutines and returns how long
// they took.
func (t *benchTarget) run(b *testing.B, n int) time.Duration {
	var left atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	start := time.Now()
	for range benchClients {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if !t.send(b) {
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

func (t *benchTarget) send(b *testing.B) bool {
	const body = `{"item":"book","quantity":1}`
	req, _ := http.NewRequest(http.MethodPost, t.srv.URL+"/orders", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", "bench-"+strconv.FormatInt(t.next.Add(1), 10))
	resp, err := t.client.Do(req)
	if err != nil {
		b.Error(err)
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		b.Errorf("status %d", resp.StatusCode)
		return false
	}
	return true
}

// benchServer sends b.N requests to h. With a baseline, it also sends as
// many to the baseline, in alternating rounds, and reports h's throughput
// as a multiple of the baseline's (x-none).
func benchServer(b *testing.B, h, baseline http.Handler) {
	var next atomic.Int64
	t := newBenchTarget(h, &next)
	defer t.srv.Close()
	var base *benchTarget
	rounds := 1
	if baseline != nil {
		base = newBenchTarget(baseline, &next)
		defer base.srv.Close()
		rounds = min(benchRounds, b.N)
	}
	var took, baseTook, cpu, baseCPU time.Duration
	var allocs, bytes uint64
	var ms runtime.MemStats
	b.ResetTimer()
	for i := range rounds {
		n := b.N/rounds + btoi(i < b.N%rounds)
		if base != nil {
			c0, _ := benchcpu.Process()
			baseTook += base.run(b, n)
			c1, _ := benchcpu.Process()
			baseCPU += c1 - c0
		}
		runtime.ReadMemStats(&ms)
		allocs0, bytes0 := ms.Mallocs, ms.TotalAlloc
		cpu0, _ := benchcpu.Process()
		took += t.run(b, n)
		cpu1, ok := benchcpu.Process()
		runtime.ReadMemStats(&ms)
		allocs, bytes = allocs+ms.Mallocs-allocs0, bytes+ms.TotalAlloc-bytes0
		if ok {
			cpu += cpu1 - cpu0
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/took.Seconds(), "req/s")
	if cpu > 0 {
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/req")
	}
	// The configuration's own rounds only, unlike -benchmem's B/op and
	// allocs/op, which would count the baseline's requests too.
	b.ReportMetric(float64(bytes)/float64(b.N), "B/req")
	b.ReportMetric(float64(allocs)/float64(b.N), "allocs/req")
	if base != nil {
		b.ReportMetric(baseTook.Seconds()/took.Seconds(), "x-none")
		if cpu > 0 {
			b.ReportMetric(baseCPU.Seconds()/cpu.Seconds(), "cpu-x-none")
		}
	}
}

func btoi(v bool) int {
	if v {
		return 1
	}
	return 0
}

// BenchmarkMiddlewareServe calls the handler directly, without a server or
// a network in the way, so that cpu-µs/op (the process's CPU time per
// request, steadier than ns/op on a shared machine), B/op and allocs/op
// are what the middleware adds to a request over the plain handler (none),
// with a memory store; the request and its recorder are built in both.
func BenchmarkMiddlewareServe(b *testing.B) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"order_id":"ord_1"}`))
	})
	serve := func(b *testing.B, h http.Handler) {
		var next atomic.Int64
		b.ReportAllocs()
		cpu0, ok := benchcpu.Process()
		defer func() {
			if cpu1, _ := benchcpu.Process(); ok {
				b.ReportMetric(float64((cpu1-cpu0).Nanoseconds())/float64(b.N)/1000, "cpu-µs/op")
			}
		}()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book","quantity":1}`))
				req.Header.Set("Idempotency-Key", "bench-"+strconv.FormatInt(next.Add(1), 10))
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusCreated {
					b.Errorf("status %d", rec.Code)
					return
				}
			}
		})
	}
	b.Run("none", func(b *testing.B) { serve(b, handler) })
	b.Run("memory", func(b *testing.B) { serve(b, withMiddleware(b, server.NewMemoryStore(), handler)) })
	// OnOutcome set to a function that does nothing: what the hook costs
	// when used, against "memory" (unset) for when it is not.
	b.Run("memory-onoutcome", func(b *testing.B) {
		serve(b, withMiddleware(b, server.NewMemoryStore(), handler, func(c *server.Config) {
			c.OnOutcome = func(context.Context, server.Outcome) {}
		}))
	})
}
