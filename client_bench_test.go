package idem_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/benchcpu"
)

// benchServer answers every POST with a small 201, like an API creating a
// resource, and does nothing else: the benchmark measures the client.
func benchServer(b *testing.B) *httptest.Server {
	b.Helper()
	body := []byte(`{"order_id":"ord_123","status":"created"}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	}))
	b.Cleanup(srv.Close)
	return srv
}

func benchTransport() *http.Transport {
	t := cleanhttp.DefaultPooledTransport()
	t.MaxIdleConnsPerHost = 256
	return t
}

var benchBody = bytes.Repeat([]byte("x"), 200)

// runConcurrent runs b.N calls of fn from exactly n goroutines, a closed
// loop (each goroutine starts its next call when its last one returns), and
// reports ops/s; the median and 99th percentile of the calls' latencies
// (p50-µs, p99-µs); and the CPU time of the whole process per call
// (cpu-µs/op: user and system, every goroutine, the loopback server's
// included), where the system tells it.
func runConcurrent(b *testing.B, n int, fn func(i int64) error) {
	b.Helper()
	// Call i's latency goes to lat[i-1]: preallocated, outside the timer,
	// and no goroutine waits for another to record one.
	lat := make([]time.Duration, b.N)
	cpu0, cpuOK := benchcpu.Process()
	b.ResetTimer()
	t0 := time.Now()
	err := spread(b.N, n, func(i int64) error {
		t0 := time.Now()
		err := fn(i)
		lat[i-1] = time.Since(t0)
		return err
	})
	elapsed := time.Since(t0)
	b.StopTimer()
	cpu1, _ := benchcpu.Process()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	slices.Sort(lat)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ReportMetric(us(lat[(len(lat)-1)*50/100]), "p50-µs")
	b.ReportMetric(us(lat[(len(lat)-1)*99/100]), "p99-µs")
	if cpuOK {
		b.ReportMetric(us(cpu1-cpu0)/float64(b.N), "cpu-µs/op")
	}
}

// BenchmarkDo compares Do (SQLite journal, synchronous=FULL, one durable
// write per operation) with a plain go-retryablehttp POST to the same
// loopback server, at 1, 16 and 64 concurrent callers; memory is Do with a
// MemoryJournal, the client's own cost.
//
//	go test -run '^$' -bench 'Do$' -benchtime 2s -count 5 .
func BenchmarkDo(b *testing.B) {
	for _, callers := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("plain/callers=%d", callers), func(b *testing.B) {
			srv := benchServer(b)
			rc := &retryablehttp.Client{HTTPClient: &http.Client{Transport: benchTransport()},
				RetryMax: 4, CheckRetry: retryablehttp.DefaultRetryPolicy, Backoff: retryablehttp.DefaultBackoff,
				RetryWaitMin: 100 * time.Millisecond, RetryWaitMax: 5 * time.Second}
			runConcurrent(b, callers, func(i int64) error {
				req, err := retryablehttp.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/orders", benchBody)
				if err != nil {
					return err
				}
				resp, err := rc.Do(req)
				if err != nil {
					return err
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				return resp.Body.Close()
			})
		})
		b.Run(fmt.Sprintf("idem/callers=%d", callers), func(b *testing.B) {
			j, err := idem.OpenSQLite(filepath.Join(b.TempDir(), "ops.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer j.Close()
			benchDo(b, j, callers)
			s := j.Stats()
			b.ReportMetric(float64(s.DurableCommits)/float64(b.N), "fsyncs/op")
			b.ReportMetric(float64(s.Writes)/float64(b.N), "writes/op")
		})
		// For analysis: the client with a journal that costs next to
		// nothing and keeps nothing, to tell its own cost from the
		// journal's.
		b.Run(fmt.Sprintf("memory/callers=%d", callers), func(b *testing.B) {
			benchDo(b, idem.NewMemoryJournal(), callers)
		})
	}
}

// benchDo runs Do for distinct operations from callers goroutines against a
// no-op loopback server. It reports the time spent in the journal's writes
// and in the HTTP exchanges per operation: at one caller they add up to the
// latency, and show where it goes.
func benchDo(b *testing.B, j idem.Journal, callers int) {
	srv := benchServer(b)
	tj := &timedJournal{Journal: j}
	rt := &timedTransport{base: benchTransport()}
	c, err := idem.New(idem.Config{Journal: tj, BaseURL: srv.URL, HTTPClient: &http.Client{Transport: rt}})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	runConcurrent(b, callers, func(i int64) error {
		res, err := c.Do(context.Background(), idem.Op{ID: fmt.Sprint("checkout/cart-", i), URL: "/orders", Body: benchBody})
		if err != nil {
			return err
		}
		if res.StatusCode != http.StatusCreated {
			return fmt.Errorf("status %d", res.StatusCode)
		}
		return nil
	})
	n := float64(b.N) * 1000
	b.ReportMetric(float64(tj.spent.Load())/n, "journal-µs/op")
	b.ReportMetric(float64(rt.spent.Load())/n, "http-µs/op")
}

// timedJournal adds up the time spent in Create and Update.
type timedJournal struct {
	idem.Journal
	spent atomic.Int64
}

func (t *timedJournal) Create(ctx context.Context, r idem.Record) (idem.Record, bool, error) {
	defer t.since(time.Now())
	return t.Journal.Create(ctx, r)
}

func (t *timedJournal) Update(ctx context.Context, r idem.Record, d idem.Durability, why idem.Event) (idem.Record, error) {
	defer t.since(time.Now())
	return t.Journal.Update(ctx, r, d, why)
}

func (t *timedJournal) since(start time.Time) { t.spent.Add(int64(time.Since(start))) }

// timedTransport adds up the time spent in round trips.
type timedTransport struct {
	base  http.RoundTripper
	spent atomic.Int64
}

func (t *timedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	defer func() { t.spent.Add(int64(time.Since(start))) }()
	return t.base.RoundTrip(req)
}

// BenchmarkHooks measures what Config.Hooks cost: none set (every client
// that does not trace), and every hook set to a function that does nothing
// (the floor of any tracer), on a MemoryJournal at one caller so that the
// client's own cost shows.
//
//	go test -run '^$' -bench 'Hooks$' -benchmem -count 5 .
func BenchmarkHooks(b *testing.B) {
	noop := idem.Hooks{
		CallStart:   func(ctx context.Context, _ idem.Call) context.Context { return ctx },
		CallEnd:     func(context.Context, idem.Call, idem.CallEnd) {},
		Attempt:     func(context.Context, idem.AttemptInfo) {},
		StatusCheck: func(context.Context, idem.StatusCheckInfo) {},
		Propagate:   func(context.Context, http.Header) {},
		Link:        func(context.Context) string { return "" },
	}
	for _, tc := range []struct {
		name  string
		hooks idem.Hooks
	}{{"none", idem.Hooks{}}, {"noop", noop}} {
		b.Run(tc.name, func(b *testing.B) {
			srv := benchServer(b)
			c, err := idem.New(idem.Config{Journal: idem.NewMemoryJournal(), BaseURL: srv.URL,
				HTTPClient: &http.Client{Transport: benchTransport()}, Hooks: tc.hooks})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			b.ReportAllocs()
			var i int
			for b.Loop() {
				i++
				if _, err := c.Do(context.Background(), idem.Op{ID: fmt.Sprint("checkout/cart-", i), URL: "/orders", Body: benchBody}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
