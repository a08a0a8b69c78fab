package storebench_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/benchcpu"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/redis"
	"github.com/idemkit/idem/server"
)

var ctx = context.Background()

// BenchmarkStores sends b.N first requests (each with a new key: one
// claim, the handler, one completion) to a trivial handler on a loopback
// server, once without the middleware ("none") and once behind it on
// each store: memory, SQLite, PostgreSQL (the machine's, a schema of its
// own, a pool of 32 connections), Redis (the machine's, which keeps
// nothing on disk) and Redis with appendonly yes and appendfsync always
// (a redis-server child of the benchmark). They run in alternating
// rounds, so that a machine whose load changes during the run slows each
// alike. For each configuration c it reports c:req/s, c:x-none (its
// throughput over the plain handler's), c:cpu-µs/req (the CPU of this
// process, clients and server, per request) and, for the Redis ones,
// c:redis-cpu-µs/req (the Redis server's CPU, INFO cpu, per request; on
// the machine's Redis that counts whatever else uses it meanwhile).
//
//	cd storebench && go test -run '^$' -bench Stores -benchtime 3000x -count 3 .
func BenchmarkStores(b *testing.B) {
	durable := startRedis(b, "--appendonly", "yes", "--appendfsync", "always", "--save", "")
	for _, clients := range []int{1, 32} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			machine := redisClient(b, "127.0.0.1:6379")
			always := redisClient(b, durable)
			configs := []*config{
				{name: "none"},
				{name: "memory", store: server.NewMemoryStore()},
				{name: "sqlite", store: openSQLite(b)},
				{name: "postgres", store: openPostgres(b)},
				{name: "redis", store: openRedis(b, machine), redis: machine},
				{name: "redis-always", store: openRedis(b, always, redis.RequireDurable()), redis: always},
				{name: "redis-ap", store: openRedis(b, machine, redis.AutoPipeline()), redis: machine},
				{name: "redis-always-ap", store: openRedis(b, always, redis.RequireDurable(), redis.AutoPipeline()), redis: always},
			}
			benchStores(b, clients, configs)
		})
	}
}

// config is one configuration of the benchmark and what it measured.
type config struct {
	name  string
	store server.Store // nil: no middleware
	redis *goredis.Client

	target   *target
	took     time.Duration
	cpu      time.Duration
	redisCPU time.Duration
}

const rounds = 20

func benchStores(b *testing.B, clients int, configs []*config) {
	var next atomic.Int64
	for _, c := range configs {
		c.target = newTarget(b, c.store, &next)
		defer c.target.close()
	}
	b.ResetTimer()
	r := min(rounds, b.N)
	for i := range r {
		n := b.N / r
		if i < b.N%r {
			n++
		}
		// Each round starts with another configuration, so that none is
		// always the one that runs first after a pause.
		for j := range configs {
			c := configs[(i+j)%len(configs)]
			rc0 := redisCPU(b, c.redis)
			cpu0, _ := benchcpu.Process()
			c.took += c.target.run(b, n, clients)
			cpu1, _ := benchcpu.Process()
			c.cpu += cpu1 - cpu0
			c.redisCPU += redisCPU(b, c.redis) - rc0
		}
	}
	b.StopTimer()
	base := configs[0]
	for _, c := range configs {
		b.ReportMetric(float64(b.N)/c.took.Seconds(), c.name+":req/s")
		b.ReportMetric(float64(c.cpu.Microseconds())/float64(b.N), c.name+":cpu-µs/req")
		if c != base {
			b.ReportMetric(base.took.Seconds()/c.took.Seconds(), c.name+":x-none")
		}
		if c.redis != nil {
			b.ReportMetric(float64(c.redisCPU.Microseconds())/float64(b.N), c.name+":redis-cpu-µs/req")
		}
	}
}

// target is one loopback server, with or without the middleware.
type target struct {
	srv    *httptest.Server
	client *http.Client
	mw     *server.Middleware
	next   *atomic.Int64 // the last key sent, shared by every target
}

func newTarget(b *testing.B, store server.Store, next *atomic.Int64) *target {
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"order_id":"ord_1"}`))
	})
	t := &target{next: next}
	if store != nil {
		mw, err := server.New(server.Config{Store: store, Scope: server.SingleTenant})
		if err != nil {
			b.Fatal(err)
		}
		t.mw, h = mw, mw.Handler(h)
	}
	t.srv = httptest.NewServer(h)
	t.client = t.srv.Client()
	t.client.Transport.(*http.Transport).MaxIdleConnsPerHost = 256
	return t
}

func (t *target) close() {
	t.srv.Close()
	if t.mw != nil {
		_ = t.mw.Close()
	}
}

// run sends n requests from clients goroutines and returns how long they
// took.
func (t *target) run(b *testing.B, n, clients int) time.Duration {
	var left atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
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

func (t *target) send(b *testing.B) bool {
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

func openSQLite(b *testing.B) server.Store {
	s, err := server.OpenSQLiteStore(filepath.Join(b.TempDir(), "keys.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// openPostgres opens the PostgreSQL store in a schema of its own on the
// machine's server, on a pool of 32 connections (as an application sizes
// its pool for its clients), dropped when the benchmark ends.
func openPostgres(b *testing.B) server.Store {
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable&pool_max_conns=32")
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		b.Fatalf("PostgreSQL at 127.0.0.1:5432 (database test) cannot be reached: %v", err)
	}
	schema := "idem_bench_" + randomHex(6)
	b.Cleanup(func() {
		_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		pool.Close()
	})
	s, err := postgres.OpenStore(ctx, pool, postgres.Schema(schema))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

func redisClient(b *testing.B, addr string) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	b.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(ctx).Err(); err != nil {
		b.Fatalf("no Redis answers at %s: %v", addr, err)
	}
	return c
}

// openRedis opens the Redis store under a prefix of its own, whose keys
// are deleted when the benchmark ends.
func openRedis(b *testing.B, c *goredis.Client, opts ...redis.Option) server.Store {
	prefix := "idembench:" + randomHex(8) + ":"
	b.Cleanup(func() {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			_ = c.Unlink(ctx, iter.Val()).Err()
		}
	})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := redis.Open(ctx, c, append([]redis.Option{redis.Prefix(prefix), redis.Logger(quiet)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// redisCPU returns the CPU time the Redis server has used (INFO cpu), or
// 0 without a client.
func redisCPU(b *testing.B, c *goredis.Client) time.Duration {
	if c == nil {
		return 0
	}
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), f); ok {
				s, _ := strconv.ParseFloat(v, 64)
				total += s
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
