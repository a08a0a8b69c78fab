// This program is examples/server with its keys in Redis: the orders API
// whose POST /orders is made safe to retry by the server middleware, and
// the status endpoint GET /idempotency/{key}, with the middleware's keys in
// a redis.Store, so that several replicas of it on one Redis share their
// keys. Orders stay in an SQLite file (each replica's own, here; a fleet
// keeps them in its shared database) with the key under a UNIQUE
// constraint. It is a module of its own, so that go-redis stays out of
// the root module.
//
//	cd examples/redisserver && go run . -addr 127.0.0.1:8080 -redis 127.0.0.1:6379 -data /tmp
//	curl -i -X POST localhost:8080/orders -H 'X-Tenant: acme' -H 'Idempotency-Key: 0b0e…' -d '{"item":"book","quantity":1}'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/examples/server/orders"
	"github.com/idemkit/idem/redis"
	"github.com/idemkit/idem/server"
)

var (
	addr      = flag.String("addr", "127.0.0.1:8080", "address to listen on")
	redisAddr = flag.String("redis", "127.0.0.1:6379", "address of the Redis that keeps the idempotency keys")
	prefix    = flag.String("prefix", "idem:orders:", "prefix of the keys in Redis")
	durable   = flag.Bool("require-durable", false, "refuse a Redis that could lose a completion in a crash (needs appendonly yes, appendfsync always)")
	pipeline  = flag.Bool("autopipeline", false, "send the store's scripts through go-redis's autopipeliner: less CPU under many concurrent requests (see BENCHMARKS.md)")
	dataDir   = flag.String("data", ".", "directory of orders.db")
	lockTime  = flag.Duration("lock-timeout", server.DefaultLockTimeout,
		"how long a key stays locked after its replica stopped renewing it (died): a retry waits that long before it runs the handler again")
)

// listening is told the address once the server accepts connections.
var listening = func(addr string) { log.Printf("listening on http://%s", addr) }

// routes builds the API on the app and the middleware; the fleet test
// wraps the orders handler to log its runs.
var routes = func(app *orders.App, mw *server.Middleware) http.Handler { return orders.Mux(app, mw) }

func main() {
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		log.Fatal(err)
	}
}

// run serves the API until ctx ends, then shuts down gracefully.
func run(ctx context.Context) error {
	client := goredis.NewClient(&goredis.Options{Addr: *redisAddr})
	defer client.Close()
	opts := []redis.Option{redis.Prefix(*prefix), redis.Logger(slog.Default())}
	if *durable {
		opts = append(opts, redis.RequireDurable())
	}
	if *pipeline {
		opts = append(opts, redis.AutoPipeline())
	}
	// Open logs what a crash of this Redis can cost.
	store, err := redis.Open(ctx, client, opts...)
	if err != nil {
		return err
	}
	defer store.Close()
	app, err := orders.New(filepath.Join(*dataDir, "orders.db"))
	if err != nil {
		return err
	}
	defer app.Close()
	mw, err := server.New(server.Config{
		Store: store,
		// Keys are per tenant: one tenant never sees another's responses.
		Scope:       orders.Tenant,
		LockTimeout: *lockTime,
	})
	if err != nil {
		return err
	}
	defer mw.Close()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: routes(app, mw), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	listening(ln.Addr().String())

	select {
	case err := <-served:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
