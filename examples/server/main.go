// This program shows the server side of idem: an orders API whose
// POST /orders is made safe to retry by the server middleware, with its
// keys in an SQLite store so that they survive restarts, and the status
// endpoint GET /idempotency/{key} that idem clients ask when an outcome is
// unknown. The tenant comes from the X-Tenant header (a real service takes
// it from the credential, in an authentication layer in front of both
// routes), and the orders table keeps the key under a UNIQUE constraint as
// a second guard. The application is package orders beside this file; the
// whole pattern uses idem's public server package, database/sql and the
// SQLite driver only, so it can be copied into a module of your own.
//
//	go run ./examples/server -addr 127.0.0.1:8080 -data /tmp
//	curl -i -X POST localhost:8080/orders -H 'Idempotency-Key: 0b0e…' -d '{"item":"book","quantity":1}'
//	curl -i localhost:8080/idempotency/0b0e…
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/idemkit/idem/examples/server/orders"
	"github.com/idemkit/idem/server"
)

var (
	addr    = flag.String("addr", "127.0.0.1:8080", "address to listen on")
	dataDir = flag.String("data", ".", "directory of keys.db (idempotency keys) and orders.db")
)

// listening is told the address once the server accepts connections.
var listening = func(addr string) { log.Printf("listening on http://%s", addr) }

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
	store, err := server.OpenSQLiteStore(filepath.Join(*dataDir, "keys.db"))
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
		Scope: orders.Tenant,
	})
	if err != nil {
		return err
	}
	defer mw.Close()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: orders.Mux(app, mw), ReadHeaderTimeout: 10 * time.Second}
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
