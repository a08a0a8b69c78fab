package server_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/server"
)

// BenchmarkMiddleware measures requests per second of a trivial handler
// through a real loopback server: without the middleware, and with it on
// each store. Every request carries a new key, so each one claims, runs and
// completes (the cost of a first request, not of a replay).
//
//	go test -run '^$' -bench Middleware -benchtime 5s ./server
func BenchmarkMiddleware(b *testing.B) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"order_id":"ord_1"}`))
	})
	b.Run("none", func(b *testing.B) { benchServer(b, handler) })
	b.Run("memory", func(b *testing.B) {
		benchServer(b, withMiddleware(b, server.NewMemoryStore(), handler))
	})
	b.Run("sqlite", func(b *testing.B) {
		benchServer(b, withMiddleware(b, benchSQLite(b), handler))
	})
	b.Run("sqlite-deferred-completes", func(b *testing.B) {
		benchServer(b, withMiddleware(b, benchSQLite(b, server.SQLiteDeferCompletes()), handler))
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

func withMiddleware(b *testing.B, store server.Store, h http.Handler) http.Handler {
	mw, err := server.New(server.Config{Store: store, Scope: server.SingleTenant})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = mw.Close() })
	return mw.Handler(h)
}

func benchServer(b *testing.B, h http.Handler) {
	srv := httptest.NewServer(h)
	defer srv.Close()
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = 256
	var next atomic.Int64
	body := `{"item":"book","quantity":1}`
	// A server has many clients at once: 16 per CPU lets group commit
	// share fsyncs as it would in production.
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
			req.Header.Set("Idempotency-Key", "bench-"+strconv.FormatInt(next.Add(1), 10))
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}
