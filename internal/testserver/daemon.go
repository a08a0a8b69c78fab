package testserver

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/idemkit/idem/internal/orders"
	"github.com/idemkit/idem/server"
)

// Daemon runs the orders application behind the middleware, every piece of
// state on disk, until ctx ends: the body of command ordersd, here so that
// any test binary can run it as a child process to SIGKILL (see ordersd's
// documentation for the flags). It prints "listening http://ADDR" once it
// accepts connections.
func Daemon(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ordersd", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "address to listen on")
	storePath := fs.String("store", "keys.db", "SQLite key store of the idempotency middleware")
	ordersPath := fs.String("orders", "orders.db", "SQLite orders database")
	lockTimeout := fs.Duration("lock-timeout", server.DefaultLockTimeout, "age at which an in-progress key whose handler died becomes retryable")
	retention := fs.Duration("retention", server.DefaultRetention, "how long keys are kept")
	skip5xx := fs.Bool("skip-server-errors", false, "do not store 5xx responses")
	delayBefore := fs.Duration("delay-before", 0, "hold each request after the claim, before creating the order")
	delayAfter := fs.Duration("delay-after", 0, "hold each request after the order is committed, before the response is stored")
	if err := fs.Parse(args); err != nil {
		return err
	}

	store, err := server.OpenSQLiteStore(*storePath)
	if err != nil {
		return err
	}
	defer store.Close()
	app, err := orders.New(*ordersPath)
	if err != nil {
		return err
	}
	defer app.Close()
	cfg := server.Config{Store: store, Scope: orders.Tenant, LockTimeout: *lockTimeout, Retention: *retention}
	if *skip5xx {
		cfg.StorePolicy = server.SkipServerErrors
	}
	mw, err := server.New(cfg)
	if err != nil {
		return err
	}
	defer mw.Close()

	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(delayed(app.Handler(), *delayBefore, *delayAfter)))
	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "listening http://%s\n", ln.Addr())

	select {
	case err := <-served:
		return err
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

// delayed holds each request before next runs, and after next committed the
// order (when it sets its status), before the response goes back to the
// middleware.
func delayed(next http.Handler, before, after time.Duration) http.Handler {
	if before <= 0 && after <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(before)
		if after > 0 {
			w = &delayWriter{ResponseWriter: w, delay: after}
		}
		next.ServeHTTP(w, r)
	})
}

type delayWriter struct {
	http.ResponseWriter
	delay time.Duration
	slept bool
}

func (w *delayWriter) WriteHeader(code int) {
	if !w.slept {
		w.slept = true
		time.Sleep(w.delay)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *delayWriter) Write(p []byte) (int, error) {
	if !w.slept {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}
