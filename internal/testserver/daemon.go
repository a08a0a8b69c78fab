package testserver

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/idemkit/idem/examples/server/orders"
	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/server"
)

// Daemon runs the orders application behind the middleware, every piece of
// state on disk, until ctx ends: the body of command ordersd, here so that
// any test binary can run it as a child process to SIGKILL (see ordersd's
// documentation for the flags; -jitter-before and -jitter-after add a random
// hold of up to the given duration to -delay-before and -delay-after, drawn
// per request from a source seeded with -seed). It prints
// "listening http://ADDR" once it accepts connections.
//
// -key-header names the one header the middleware takes the key from
// (Idempotency-Key by default); -key-quoted demands the key as an RFC 8941
// sf-string; -tenant-tokens "a=tokA,b=tokB" demands of every request the
// bearer token of its tenant (X-Tenant). With any of them, or -audit FILE,
// a check in front of the middleware refuses a request with the key in
// another header or form (400) or without its tenant's token (403), and
// appends one line per request to FILE saying what it found (see
// requestChecks).
//
// -exec-log FILE counts the orders handler's runs across SIGKILLed lives:
// every run appends "run TENANT KEY" to FILE before the application runs
// and "done TENANT KEY STATUS" once it returned, and a request that ran it
// appends "answered TENANT KEY" once the middleware has sent its response
// (the stored completion, durable, came before that). FILE is opened
// O_APPEND|O_CREATE (mode 0600) and each line is one write, so the lines of
// every life, and any a parent appends between lives, stay whole and in
// order.
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
	jitterBefore := fs.Duration("jitter-before", 0, "add a random hold from 0 to this to -delay-before, drawn per request")
	jitterAfter := fs.Duration("jitter-after", 0, "add a random hold from 0 to this to -delay-after, drawn per request")
	seed := fs.Uint64("seed", 0, "seed of the jitter's random source (0: a random seed)")
	keyHeader := fs.String("key-header", wire.KeyHeader, "the one request header that carries the key")
	keyQuoted := fs.Bool("key-quoted", false, "refuse a key that is not an RFC 8941 sf-string")
	tenantTokens := fs.String("tenant-tokens", "", "tenant=token,…: refuse a request without the bearer token of its tenant (X-Tenant)")
	auditPath := fs.String("audit", "", "append one line per request checked to this file")
	execLogPath := fs.String("exec-log", "", "append a line to this file before and after every run of the orders handler, and when its response is sent")
	if err := fs.Parse(args); err != nil {
		return err
	}
	tokens, err := parseTokens(*tenantTokens)
	if err != nil {
		return err
	}
	var checks *requestChecks
	if http.CanonicalHeaderKey(*keyHeader) != wire.KeyHeader || *keyQuoted || len(tokens) > 0 || *auditPath != "" {
		checks = &requestChecks{header: http.CanonicalHeaderKey(*keyHeader), quoted: *keyQuoted, tokens: tokens}
		if *auditPath != "" {
			f, err := os.OpenFile(*auditPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
			if err != nil {
				return err
			}
			defer f.Close()
			checks.log = f
		}
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
	cfg := server.Config{Store: store, Scope: orders.Tenant, Header: *keyHeader, LockTimeout: *lockTimeout, Retention: *retention}
	if *skip5xx {
		cfg.StorePolicy = server.SkipServerErrors
	}
	mw, err := server.New(cfg)
	if err != nil {
		return err
	}
	defer mw.Close()

	mux := http.NewServeMux()
	holds := newHolds(*delayBefore, *jitterBefore, *delayAfter, *jitterAfter, *seed)
	appHandler := delayed(app.Handler(), holds)
	var execs *execLog
	if *execLogPath != "" {
		f, err := os.OpenFile(*execLogPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		execs = &execLog{w: f}
		appHandler = execs.runs(appHandler)
	}
	orderHandler, statusHandler := mw.Handler(appHandler), mw.StatusHandler()
	if execs != nil {
		orderHandler = execs.answers(orderHandler)
	}
	if checks != nil {
		orderHandler, statusHandler = checks.orders(orderHandler), checks.status(statusHandler)
	}
	mux.Handle("POST /orders", orderHandler)
	mux.Handle("GET /idempotency/{key}", statusHandler)

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

// execLog appends a line per run of the orders handler, and one per
// response sent for a request that ran it, to a file shared by every life
// of the server (see Daemon).
type execLog struct {
	w io.Writer
}

// execRunKey is the context key of the *execRun that answers hands to runs.
type execRunKey struct{}

// execRun is what runs tells answers: the handler ran under this key.
type execRun struct {
	ran         bool
	tenant, key string
}

func (l *execLog) line(format string, args ...any) {
	// One write per line: O_APPEND keeps it whole among other writers.
	_, _ = l.w.Write(fmt.Appendf(nil, format+"\n", args...))
}

// runs wraps the handler the middleware runs at most once per key.
func (l *execLog) runs(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, _ := server.KeyFromContext(r.Context())
		tenant := orders.Tenant(r)
		if run, ok := r.Context().Value(execRunKey{}).(*execRun); ok {
			run.ran, run.tenant, run.key = true, tenant, key
		}
		l.line("run %s %s", tenant, key)
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		l.line("done %s %s %d", tenant, key, sw.status)
	})
}

// answers wraps the middleware: once it has answered a request whose
// handler ran, the answer's line is appended.
func (l *execLog) answers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		run := &execRun{}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), execRunKey{}, run)))
		if run.ran {
			l.line("answered %s %s", run.tenant, run.key)
		}
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.wrote, w.status = true, code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(p)
}

// holds draws how long each request is held before and after its order is
// committed: a fixed delay plus a jitter drawn uniformly from [0, jitter]
// per request, from a seeded source so that a crash test can name its run.
type holds struct {
	before, jitterBefore time.Duration
	after, jitterAfter   time.Duration

	mu  sync.Mutex
	rnd *rand.Rand
}

func newHolds(before, jitterBefore, after, jitterAfter time.Duration, seed uint64) *holds {
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &holds{before: before, jitterBefore: max(jitterBefore, 0), after: after, jitterAfter: max(jitterAfter, 0),
		rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (h *holds) none() bool {
	return h.before <= 0 && h.jitterBefore <= 0 && h.after <= 0 && h.jitterAfter <= 0
}

// draw returns the holds of one request.
func (h *holds) draw() (before, after time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	before, after = h.before, h.after
	if h.jitterBefore > 0 {
		before += time.Duration(h.rnd.Int64N(int64(h.jitterBefore) + 1))
	}
	if h.jitterAfter > 0 {
		after += time.Duration(h.rnd.Int64N(int64(h.jitterAfter) + 1))
	}
	return before, after
}

// delayed holds each request before next runs, and after next committed the
// order (when it sets its status), before the response goes back to the
// middleware.
func delayed(next http.Handler, h *holds) http.Handler {
	if h.none() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		before, after := h.draw()
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
