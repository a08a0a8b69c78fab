package idem_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
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
// ratio, and the peak Go heap in use while Resume runs (sampled every 20
// ms), which must not grow with n.
//
//	go test -run '^$' -bench ResumeAtScale -benchtime 1x -count 3 .
func BenchmarkResumeAtScale(b *testing.B) {
	for _, n := range []int{2_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("operations=%d", n), func(b *testing.B) {
			srv := resumeServer(b)
			var doRate, resumeRate, peak float64
			for range b.N {
				d, r, p := resumeAtScaleOnce(b, srv.URL, n)
				doRate, resumeRate, peak = doRate+d, resumeRate+r, max(peak, p)
			}
			b.ReportMetric(doRate/float64(b.N), "do-ops/s")
			b.ReportMetric(resumeRate/float64(b.N), "resume-ops/s")
			b.ReportMetric(resumeRate/doRate, "resume/do")
			b.ReportMetric(peak/(1<<20), "peak-heap-MiB")
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

func resumeAtScaleOnce(b *testing.B, url string, n int) (doRate, resumeRate, peakHeap float64) {
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
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var ms runtime.MemStats
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
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
	return doRate, float64(n) / elapsed.Seconds(), float64(peak.Load())
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
