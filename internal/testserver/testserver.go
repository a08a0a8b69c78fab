// Package testserver runs the orders application of the server example
// (examples/server/orders) behind the server middleware on a real loopback
// HTTP server, with faults injected per request, for the client's tests.
//
//	s := testserver.Start(t)
//	s.Inject(testserver.DropAfterCommit) // the next POST /orders
//	… drive the client against s.URL and s.StatusURL …
//	assert.Equal(t, 1, s.TotalOrders())
//
// The fault layer sits in front of the middleware: a fault "after commit"
// lets the middleware create the order and store its response first.
package testserver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/examples/server/orders"
	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/server"
)

// Server is a running test server. It is safe for concurrent use.
type Server struct {
	// URL is the server's base URL, such as http://127.0.0.1:41234; orders
	// are created with POST URL/orders.
	URL string
	// StatusURL is URL/idempotency; ask GET StatusURL/{key}.
	StatusURL string

	t     testing.TB
	srv   *httptest.Server
	app   *orders.App
	mw    *server.Middleware
	store server.Store
	stop  chan struct{}

	mu             sync.Mutex
	faults         []Fault
	statusFaults   []StatusFault
	keys           []string
	requests       int
	statusRequests int

	closeOnce sync.Once
}

type config struct {
	mw          server.Config
	sqliteStore bool
	addr        string
	wrap        func(http.Handler) http.Handler
}

// Option configures Start.
type Option func(*config)

// WithAddr listens on addr (host:port) instead of a free port: a test can
// find nothing listening there first, then start the server.
func WithAddr(addr string) Option { return func(c *config) { c.addr = addr } }

// WithSQLiteStore keeps the middleware's entries in an SQLite file instead
// of memory.
func WithSQLiteStore() Option { return func(c *config) { c.sqliteStore = true } }

// WithLockTimeout sets the middleware's LockTimeout.
func WithLockTimeout(d time.Duration) Option { return func(c *config) { c.mw.LockTimeout = d } }

// WithRetention sets the middleware's Retention.
func WithRetention(d time.Duration) Option { return func(c *config) { c.mw.Retention = d } }

// WithStorePolicy sets the middleware's StorePolicy.
func WithStorePolicy(p server.StorePolicy) Option { return func(c *config) { c.mw.StorePolicy = p } }

// WithOnOutcome sets the middleware's OnOutcome.
func WithOnOutcome(fn func(context.Context, server.Outcome)) Option {
	return func(c *config) { c.mw.OnOutcome = fn }
}

// WithWrap puts wrap's handler in front of every route, before the fault
// layer, where an application's HTTP instrumentation (otelhttp, say) sits:
// it sees every request as it arrived, and its request context is the one
// the middleware and OnOutcome get.
func WithWrap(wrap func(http.Handler) http.Handler) Option {
	return func(c *config) { c.wrap = wrap }
}

// WithRetryAfter sets the Retry-After of the middleware's 409 and 503.
func WithRetryAfter(d time.Duration) Option { return func(c *config) { c.mw.RetryAfter = d } }

// Start starts a server on 127.0.0.1 with a new orders database (and key
// store) under t.TempDir(). t.Cleanup closes it.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	dir := t.TempDir()
	s := &Server{t: t, stop: make(chan struct{})}
	app, err := orders.New(filepath.Join(dir, "orders.db"))
	if err != nil {
		t.Fatalf("testserver: %v", err)
	}
	s.app = app
	if cfg.sqliteStore {
		st, err := server.OpenSQLiteStore(filepath.Join(dir, "keys.db"))
		if err != nil {
			_ = app.Close()
			t.Fatalf("testserver: %v", err)
		}
		s.store = st
	} else {
		s.store = server.NewMemoryStore()
	}
	cfg.mw.Store = s.store
	cfg.mw.Scope = orders.Tenant
	mw, err := server.New(cfg.mw)
	if err != nil {
		s.closeStores()
		t.Fatalf("testserver: %v", err)
	}
	s.mw = mw

	mux := http.NewServeMux()
	mux.Handle("POST /orders", http.HandlerFunc(s.serveOrders(mw.Handler(slowable(app.Handler(), s.stop)))))
	mux.Handle("GET /idempotency/{key}", http.HandlerFunc(s.serveStatus(mw.StatusHandler())))
	var h http.Handler = mux
	if cfg.wrap != nil {
		h = cfg.wrap(mux)
	}
	s.srv = httptest.NewUnstartedServer(h)
	if cfg.addr != "" {
		l, err := net.Listen("tcp", cfg.addr)
		if err != nil {
			s.closeStores()
			t.Fatalf("testserver: %v", err)
		}
		_ = s.srv.Listener.Close()
		s.srv.Listener = l
	}
	// Dropped and reset connections are the point here, not news.
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.srv.Start()
	s.URL = s.srv.URL
	s.StatusURL = s.srv.URL + "/idempotency"
	t.Cleanup(s.Close)
	return s
}

// Close stops the server: held requests are let go, then the server, the
// middleware and the databases are closed. Requests after Close fail to
// connect. t.Cleanup calls it; calling it earlier simulates a server that
// went away.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.stop)
		s.srv.Close()
		_ = s.mw.Close()
		s.closeStores()
	})
}

func (s *Server) closeStores() {
	if c, ok := s.store.(io.Closer); ok {
		_ = c.Close()
	}
	_ = s.app.Close()
}

// Client returns an HTTP client for the server, closed with it.
func (s *Server) Client() *http.Client { return s.srv.Client() }

// Inject queues f for the next POST /orders request that has no fault yet
// (first in, first out).
func (s *Server) Inject(f Fault) { s.InjectN(f, 1) }

// InjectN queues f for the next n POST /orders requests.
func (s *Server) InjectN(f Fault, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.faults = append(s.faults, f)
	}
}

// InjectStatus queues f for the next status request.
func (s *Server) InjectStatus(f StatusFault) { s.InjectStatusN(f, 1) }

// InjectStatusN queues f for the next n status requests.
func (s *Server) InjectStatusN(f StatusFault, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.statusFaults = append(s.statusFaults, f)
	}
}

// PendingFaults returns how many injected faults of each kind of request
// have not been used yet.
func (s *Server) PendingFaults() (orders, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.faults), len(s.statusFaults)
}

// Requests returns how many POST /orders requests reached the server,
// including those the fault layer answered itself.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// StatusRequests returns how many status requests reached the server.
func (s *Server) StatusRequests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statusRequests
}

// KeysSeen returns every Idempotency-Key header value the POST /orders
// requests carried, as sent, in the order they arrived.
func (s *Server) KeysSeen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

// Orders returns how many orders tenant has ("" is orders.DefaultTenant).
func (s *Server) Orders(tenant string) int {
	if tenant == "" {
		tenant = orders.DefaultTenant
	}
	n, err := s.app.Orders(context.Background(), tenant)
	if err != nil {
		s.t.Errorf("testserver: counting orders: %v", err)
	}
	return n
}

// TotalOrders returns how many orders exist across tenants.
func (s *Server) TotalOrders() int {
	n, err := s.app.TotalOrders(context.Background())
	if err != nil {
		s.t.Errorf("testserver: counting orders: %v", err)
	}
	return n
}

// Executions returns how many times the orders handler ran.
func (s *Server) Executions() int { return s.app.Executions() }

// GuardedDuplicates returns how many handler runs found their key's order
// already there (the application's UNIQUE guard).
func (s *Server) GuardedDuplicates() int { return s.app.GuardedDuplicates() }

// Store returns the middleware's store, to inspect or age entries.
func (s *Server) Store() server.Store { return s.store }

func (s *Server) nextFault() (Fault, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.faults) == 0 {
		return Fault{}, false
	}
	f := s.faults[0]
	s.faults = s.faults[1:]
	return f, true
}

func (s *Server) nextStatusFault() (StatusFault, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.statusRequests++
	if len(s.statusFaults) == 0 {
		return StatusFault{}, false
	}
	f := s.statusFaults[0]
	s.statusFaults = s.statusFaults[1:]
	return f, true
}

type delayKey struct{}

// slowable runs next after the delay a SlowHandler fault put in the
// request's context. It sits behind the middleware, so the key is claimed
// while it waits.
func slowable(next http.Handler, stop <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d, ok := r.Context().Value(delayKey{}).(time.Duration); ok {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-stop:
				t.Stop()
			}
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) serveOrders(next http.Handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests++
		s.keys = append(s.keys, r.Header.Values(wire.KeyHeader)...)
		s.mu.Unlock()
		f, ok := s.nextFault()
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		switch f.kind {
		case faultDropBeforeHandler:
			_, _ = io.Copy(io.Discard, r.Body)
			drop(w)
		case faultServerErrorBeforeCommit:
			_, _ = io.Copy(io.Discard, r.Body)
			http.Error(w, "injected: internal server error", http.StatusInternalServerError)
		case faultUnavailableBeforeCommit:
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Retry-After", "1")
			http.Error(w, "injected: service unavailable", http.StatusServiceUnavailable)
		case faultTooManyRequests:
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Retry-After", "1")
			http.Error(w, "injected: too many requests", http.StatusTooManyRequests)
		case faultDropAfterCommit:
			commit(next, r)
			drop(w)
		case faultHoldPastTimeout:
			commit(next, r)
			select {
			case <-r.Context().Done():
			case <-s.stop:
			}
			drop(w)
		case faultServerErrorAfterCommit:
			commit(next, r)
			http.Error(w, "injected: internal server error after commit", http.StatusInternalServerError)
		case faultResetMidBody:
			reset(sendHalf(w, commit(next, r)))
		case faultStallMidBody:
			stall(sendHalf(w, commit(next, r)), s.stop)
		case faultSlowHandler:
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), delayKey{}, f.delay)))
		default:
			panic(fmt.Sprintf("testserver: unknown fault %v", f))
		}
	}
}

// commit lets the middleware run the request to the end, storing its
// response, and returns the response it would have sent.
func commit(next http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	next.ServeHTTP(rec, r)
	return rec
}

// drop closes the connection without a response.
func drop(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler) // net/http closes the connection
	}
	_ = conn.Close()
}

// sendHalf sends the status line, the headers (with the full
// Content-Length) and half the body, and returns the connection.
func sendHalf(w http.ResponseWriter, rec *httptest.ResponseRecorder) net.Conn {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	body := rec.Body.Bytes()
	var head bytes.Buffer
	fmt.Fprintf(&head, "HTTP/1.1 %d %s\r\n", rec.Code, http.StatusText(rec.Code))
	h := rec.Header().Clone()
	h.Set("Content-Length", strconv.Itoa(len(body)))
	_ = h.Write(&head)
	head.WriteString("\r\n")
	head.Write(body[:len(body)/2])
	_, _ = buf.Write(head.Bytes())
	_ = buf.Flush()
	return conn
}

// stall sends nothing more on conn until the client closes it or the
// server stops.
func stall(conn net.Conn, stop <-chan struct{}) {
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-stop:
		case <-done:
		}
		_ = conn.Close()
	}()
	_, _ = io.Copy(io.Discard, conn)
}

// reset closes conn with a TCP RST instead of a FIN.
func reset(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

func (s *Server) serveStatus(next http.Handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f, ok := s.nextStatusFault()
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		switch f.kind {
		case statusFaultDown:
			http.Error(w, "injected: status endpoint down", http.StatusInternalServerError)
		case statusFaultHang:
			select {
			case <-r.Context().Done():
			case <-s.stop:
			}
			drop(w)
		case statusFaultGarbage:
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte("<html>this is not JSON</html>"))
		default:
			panic(fmt.Sprintf("testserver: unknown status fault %v", f))
		}
	}
}
