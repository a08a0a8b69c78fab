package redis_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/redis"
	"github.com/idemkit/idem/server"
)

// BenchmarkMiddlewareStore measures requests per second of a trivial
// handler on a real loopback server: without the middleware, and with it
// on the memory and SQLite stores and on the Redis store (the machine's
// Redis, which keeps nothing on disk, and a redis-server child with
// appendonly yes and appendfsync always), at 1 and 32 concurrent clients,
// in the same run. Every request carries a new key, so each one claims,
// runs and completes: the cost of a first request, not of a replay.
//
//	go test -run '^$' -bench MiddlewareStore -benchtime 3s -count 3 .
func BenchmarkMiddlewareStore(b *testing.B) {
	durable := startRedis(b, "--appendonly", "yes", "--appendfsync", "always", "--save", "")
	stores := []struct {
		name string
		open func(b *testing.B) server.Store
	}{
		{"none", nil},
		{"memory", func(*testing.B) server.Store { return server.NewMemoryStore() }},
		{"sqlite", func(b *testing.B) server.Store { return benchSQLite(b) }},
		{"redis", func(b *testing.B) server.Store { return openStore(b, machineClient(b)) }},
		{"redis-appendfsync-always", func(b *testing.B) server.Store {
			return openStore(b, newClient(b, durable.addr(), 0), redis.RequireDurable())
		}},
	}
	for _, clients := range []int{1, 32} {
		for _, s := range stores {
			b.Run(fmt.Sprintf("clients=%d/%s", clients, s.name), func(b *testing.B) {
				var store server.Store
				if s.open != nil {
					store = s.open(b)
				}
				benchMiddleware(b, store, clients)
			})
		}
	}
}

func benchSQLite(b *testing.B) server.Store {
	s, err := server.OpenSQLiteStore(filepath.Join(b.TempDir(), "keys.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// benchMiddleware sends b.N first requests from clients goroutines to a
// loopback server whose handler sits behind the middleware on store, or
// is reached directly when store is nil.
func benchMiddleware(b *testing.B, store server.Store, clients int) {
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"order_id":"ord_1"}`))
	})
	if store != nil {
		mw, err := server.New(server.Config{Store: store, Scope: server.SingleTenant})
		if err != nil {
			b.Fatal(err)
		}
		defer mw.Close()
		h = mw.Handler(h)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = clients
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	body := `{"item":"book","quantity":1}`
	b.ReportAllocs()
	b.ResetTimer()
	for range clients {
		wg.Go(func() {
			for {
				n := next.Add(1)
				if n > int64(b.N) {
					return
				}
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
				req.Header.Set("Idempotency-Key", "bench-"+strconv.FormatInt(n, 10))
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
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}
