package idem_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/server"
)

// BenchmarkResumeAtScale: a journal holding n operations, half pending and
// half whose outcome is unknown (a server that was down), settled by one
// Resume with ResumeConcurrency 8, against fresh Do of n operations from 8
// callers in the same run. The server creates on POST and answers 404 to
// every status check that it never saw the key (the unknown ones never
// reached it), so an unknown
// operation costs a status check and a send. Reported: ops/s of each, their
// ratio, and the memory Resume holds while it runs, which must not grow
// with n: the peak of the live heap (what the last GC found reachable,
// sampled every 20 ms) and the peak resident set of the process less its
// resident set before Resume (the Do phase and the seeding ran before, in
// the same process).
//
//	go test -run '^$' -bench ResumeAtScale -benchtime 1x -count 3 .
func BenchmarkResumeAtScale(b *testing.B) {
	for _, n := range []int{2_000, 10_000, 100_000, 200_000} { // 200,000: the 100k pending and 100k unknown
		b.Run(fmt.Sprintf("operations=%d", n), func(b *testing.B) {
			srv := resumeServer(b)
			var doRate, resumeRate, peak, rss float64
			for range b.N {
				d, r, p, m := resumeAtScaleOnce(b, srv.URL, n)
				doRate, resumeRate, peak, rss = doRate+d, resumeRate+r, max(peak, p), max(rss, m)
			}
			b.ReportMetric(doRate/float64(b.N), "do-ops/s")
			b.ReportMetric(resumeRate/float64(b.N), "resume-ops/s")
			b.ReportMetric(resumeRate/doRate, "resume/do")
			b.ReportMetric(peak/(1<<20), "peak-live-heap-MiB")
			if rss > 0 {
				b.ReportMetric(rss/(1<<20), "rss-growth-MiB")
			}
		})
	}
}

// resumeServer is the orders API behind the server middleware (memory
// store): it creates on POST /orders, and its status endpoint has never
// heard of a key it did not see. It keeps its keys for a second only, so
// that the heap measured is the client's: nothing here is replayed.
func resumeServer(b *testing.B) *httptest.Server {
	mw, err := server.New(server.Config{Store: server.NewMemoryStore(), Scope: server.SingleTenant,
		LockTimeout: 500 * time.Millisecond, Retention: time.Second, SweepInterval: 100 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = mw.Close() })
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"order_id":"ord_123"}`))
	})))
	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
	srv := httptest.NewServer(mux)
	b.Cleanup(srv.Close)
	return srv
}

func resumeAtScaleOnce(b *testing.B, url string, n int) (doRate, resumeRate, peakHeap, rssGrowth float64) {
	b.StopTimer()
	dir := b.TempDir()
	newClient := func(j idem.Journal) *idem.Client {
		t := benchTransport()
		c, err := idem.New(idem.Config{Journal: j, BaseURL: url, Status: idem.StatusEndpoint(url + "/idempotency"),
			ResumeConcurrency: 8, HTTPClient: &http.Client{Transport: t}})
		if err != nil {
			b.Fatal(err)
		}
		return c
	}

	// Fresh Do, from 8 callers.
	jd, err := idem.OpenSQLite(filepath.Join(dir, "do.db"))
	if err != nil {
		b.Fatal(err)
	}
	cd := newClient(jd)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				if _, err := cd.Do(context.Background(), idem.Op{ID: fmt.Sprint("order-", i), URL: "/orders", Body: benchBody}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	doRate = float64(n) / time.Since(start).Seconds()
	_ = cd.Close()
	_ = jd.Close()

	// A journal of n unsettled operations.
	path := filepath.Join(dir, "resume.db")
	j, err := idem.OpenSQLite(path)
	if err != nil {
		b.Fatal(err)
	}
	seedUnsettled(b, j, url, n)
	c := newClient(j)
	defer j.Close()
	defer c.Close()

	runtime.GC()
	rss0 := residentBytes()
	var peak, peakRSS atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(live)
			if v := live[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
			if v := residentBytes(); v > peakRSS.Load() {
				peakRSS.Store(v)
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	b.StartTimer()
	start = time.Now()
	rep, err := c.Resume(context.Background())
	elapsed := time.Since(start)
	b.StopTimer()
	close(stop)
	<-sampled
	if err != nil {
		b.Fatal(err)
	}
	if rep.Succeeded != n {
		b.Fatalf("Resume settled %d of %d operations: %+v", rep.Succeeded, n, rep)
	}
	if rss0 > 0 && peakRSS.Load() > rss0 {
		rssGrowth = float64(peakRSS.Load() - rss0)
	}
	return doRate, float64(n) / elapsed.Seconds(), float64(peak.Load()), rssGrowth
}

// residentBytes is the process's resident set size, or 0 where
// /proc/self/statm does not tell it.
func residentBytes() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	var size, resident uint64
	if _, err := fmt.Sscan(string(b), &size, &resident); err != nil {
		return 0
	}
	return resident * uint64(os.Getpagesize())
}

// seedUnsettled journals n operations to url/orders as a crashed
// application would have left them: half pending, never sent, and half
// sent with no answer (in_flight, their outcome unknown).
func seedUnsettled(b *testing.B, j idem.Journal, url string, n int) {
	sum := sha256.Sum256(benchBody)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				rec := idem.Record{Key: uuid.NewString(), Scope: "default", ID: fmt.Sprint("seeded-", i),
					Method: http.MethodPost, URL: url + "/orders", Body: benchBody,
					Fingerprint: hex.EncodeToString(sum[:]), KeyHeader: "Idempotency-Key", State: idem.StatePending}
				if i%2 == 0 {
					rec.State, rec.Attempts, rec.ExpiresAt = idem.StateInFlight, 1, time.Now().Add(time.Hour)
				}
				if _, _, err := j.Create(context.Background(), rec); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}

// BenchmarkResumeNeighbour: while one client Resumes a journal of n
// unsettled operations (ResumeConcurrency 8), a second client on its own
// handle of the same journal file (its own connections and write lock
// requests, as another process has) does fresh Do from one caller.
// Reported: the neighbour's ops/s and p99 during the Resume against the
// same neighbour alone just before, in the same run: a Resume must not
// starve the application's new work of the journal's write lock.
//
//	go test -run '^$' -bench ResumeNeighbour -benchtime 1x -count 3 .
func BenchmarkResumeNeighbour(b *testing.B) {
	const n = 5_000
	srv := resumeServer(b)
	var alone, during, p99Alone, p99During float64
	for range b.N {
		b.StopTimer()
		dir := b.TempDir()
		path := filepath.Join(dir, "ops.db")
		open := func() (*idem.SQLiteJournal, *idem.Client) {
			j, err := idem.OpenSQLite(path)
			if err != nil {
				b.Fatal(err)
			}
			c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/idempotency"),
				ResumeConcurrency: 8, HTTPClient: &http.Client{Transport: benchTransport()}})
			if err != nil {
				b.Fatal(err)
			}
			return j, c
		}
		jr, resumer := open()
		seedUnsettled(b, jr, srv.URL, n)
		jn, neighbour := open()

		// The neighbour's Do, one caller, until stop; returns ops/s and p99.
		var seq atomic.Int64
		work := func(stop <-chan struct{}) (float64, float64) {
			var lat []time.Duration
			start := time.Now()
			for {
				select {
				case <-stop:
					elapsed := time.Since(start)
					slices.Sort(lat)
					if len(lat) == 0 {
						return 0, 0
					}
					return float64(len(lat)) / elapsed.Seconds(), float64(lat[(len(lat)-1)*99/100]) / float64(time.Microsecond)
				default:
				}
				t0 := time.Now()
				if _, err := neighbour.Do(context.Background(), idem.Op{ID: fmt.Sprint("new-", seq.Add(1)), URL: "/orders", Body: benchBody}); err != nil {
					b.Error(err)
				}
				lat = append(lat, time.Since(t0))
			}
		}
		stop := make(chan struct{})
		time.AfterFunc(2*time.Second, func() { close(stop) })
		a, pa := work(stop)

		b.StartTimer()
		stop = make(chan struct{})
		resumed := make(chan error, 1)
		go func() {
			rep, err := resumer.Resume(context.Background())
			if err == nil && rep.Succeeded != n {
				err = fmt.Errorf("Resume settled %d of %d: %+v", rep.Succeeded, n, rep)
			}
			close(stop)
			resumed <- err
		}()
		d, pd := work(stop)
		if err := <-resumed; err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		alone, during, p99Alone, p99During = alone+a, during+d, p99Alone+pa, p99During+pd
		_ = neighbour.Close()
		_ = resumer.Close()
		_ = jn.Close()
		_ = jr.Close()
	}
	k := float64(b.N)
	b.ReportMetric(alone/k, "alone-ops/s")
	b.ReportMetric(during/k, "during-ops/s")
	b.ReportMetric(during/alone, "during/alone")
	b.ReportMetric(p99During/p99Alone, "p99-during/alone")
}
