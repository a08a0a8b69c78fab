package server_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/server"
)

// timeout and tick bound require.Eventually: how long a condition may take
// to come true (generous, for loaded CI machines) and how often it is
// checked.
const (
	timeout = 10 * time.Second
	tick    = 5 * time.Millisecond
)

func timeNow() time.Time { return time.Now() }

// clock is a test clock that moves only when told to.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// env is a real loopback server: the middleware in front of a handler,
// with the status endpoint at /idempotency/{key}.
type env struct {
	t     *testing.T
	srv   *httptest.Server
	mw    *server.Middleware
	store server.Store
	clock *clock
	calls atomic.Int64
}

type envOption func(*server.Config)

// newEnv starts a server whose idempotent routes run h (counting its calls)
// under a middleware configured by opts, on a memory store unless an option
// sets another.
func newEnv(t *testing.T, h http.HandlerFunc, opts ...envOption) *env {
	t.Helper()
	return newWrappedEnv(t, h, nil, opts...)
}

// newWrappedEnv is newEnv with wrap, if not nil, in front of everything.
func newWrappedEnv(t *testing.T, h http.HandlerFunc, wrap func(http.Handler) http.Handler, opts ...envOption) *env {
	t.Helper()
	e := &env{t: t, clock: newClock()}
	cfg := server.Config{Store: server.NewMemoryStore(), Scope: server.SingleTenant}
	for _, o := range opts {
		o(&cfg)
	}
	e.store = cfg.Store
	mw, err := server.New(server.WithClock(cfg, e.clock.Now))
	require.NoError(t, err)
	e.mw = mw
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.calls.Add(1)
		h(w, r)
	})
	mux := http.NewServeMux()
	mux.Handle("/", mw.Handler(counted))
	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
	var root http.Handler = mux
	if wrap != nil {
		root = wrap(mux)
	}
	e.srv = httptest.NewUnstartedServer(root)
	// A panicking handler is part of some tests; its stack is noise.
	e.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	e.srv.Start()
	t.Cleanup(func() {
		e.srv.Close()
		assert.NoError(t, mw.Close())
	})
	return e
}

func withStore(s server.Store) envOption { return func(c *server.Config) { c.Store = s } }

func withScope(scope func(*http.Request) string) envOption {
	return func(c *server.Config) { c.Scope = scope }
}

func withTenantScope() envOption {
	return func(c *server.Config) { c.Scope = func(r *http.Request) string { return r.Header.Get("X-Tenant") } }
}

// reply is a response read to the end.
type reply struct {
	Status int
	Header http.Header
	Body   string
}

func (r reply) replayed() bool { return r.Header.Get("Idempotent-Replayed") == "true" }

func (r reply) problem(t *testing.T) wire.Problem {
	t.Helper()
	p, ok := wire.ParseProblem(r.Header.Get("Content-Type"), []byte(r.Body))
	require.True(t, ok, "want a problem+json answer, got %d %q %q", r.Status, r.Header.Get("Content-Type"), r.Body)
	assert.Equal(t, r.Status, p.Status, "the problem's status matches the HTTP status")
	return p
}

// do sends one request; header holds name/value pairs.
func (e *env) do(method, path, body string, header ...string) reply {
	e.t.Helper()
	r, err := e.send(context.Background(), method, path, body, header...)
	require.NoError(e.t, err)
	return r
}

func (e *env) send(ctx context.Context, method, path, body string, header ...string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}, nil
}

// post sends POST path with an Idempotency-Key.
func (e *env) post(path, key, body string, header ...string) reply {
	e.t.Helper()
	return e.do(http.MethodPost, path, body, append([]string{"Idempotency-Key", key}, header...)...)
}

// status asks the status endpoint about key and decodes the answer as a
// client would.
func (e *env) status(key string, header ...string) (wire.Status, []byte, reply) {
	e.t.Helper()
	r := e.do(http.MethodGet, "/idempotency/"+key, "", header...)
	s, body, err := wire.DecodeStatus(r.Status, []byte(r.Body), key)
	require.NoError(e.t, err, "the status answer must decode: %d %s", r.Status, r.Body)
	return s, body, r
}

// created answers 201 with a JSON body that echoes the request body.
func created(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/1")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(append([]byte(`{"echo":`), append(bytes.TrimSpace(b), '}')...))
}

// gate lets a test hold handlers until it opens the gate.
type gate struct {
	entered chan struct{}
	open    chan struct{}
	once    sync.Once
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}, 1000), open: make(chan struct{})}
}

func (g *gate) wait() {
	g.entered <- struct{}{}
	<-g.open
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

// waitEntered waits until a handler is held at the gate. The gate opens
// at the latest when the test ends, before its server is closed, so that a
// failing test does not hang on its held handlers.
func (g *gate) waitEntered(t *testing.T) {
	t.Helper()
	t.Cleanup(g.release)
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler was never entered")
	}
}

// errInjected is the failure a faultyStore injects.
var errInjected = errors.New("injected store failure")

// faultyStore wraps a real store and fails its Complete or its Renew on
// command, as a disk hiccup or a lost connection to the store would. It
// records what every Complete returned.
type faultyStore struct {
	server.Store
	failCompletes atomic.Bool
	failRenewals  atomic.Bool
	// loseReplies: Complete stores, then fails as if its reply were lost.
	loseReplies atomic.Bool

	mu        sync.Mutex
	completes []error // the result of every Complete, in order
	renewals  int     // Renew calls, failed or not
}

func (s *faultyStore) Complete(ctx context.Context, req server.CompleteRequest) error {
	err := errInjected
	if !s.failCompletes.Load() {
		err = s.Store.Complete(ctx, req)
		if err == nil && s.loseReplies.Load() {
			err = errInjected
		}
	}
	s.mu.Lock()
	s.completes = append(s.completes, err)
	s.mu.Unlock()
	return err
}

func (s *faultyStore) Renew(ctx context.Context, scope, key string, token int64, now time.Time) error {
	s.mu.Lock()
	s.renewals++
	s.mu.Unlock()
	if s.failRenewals.Load() {
		return errInjected
	}
	return s.Store.Renew(ctx, scope, key, token, now)
}

// completeResults returns what every Complete returned so far.
func (s *faultyStore) completeResults() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.completes...)
}

// stores are the real stores every middleware test that depends on the
// store runs against.
var stores = map[string]func(*testing.T) server.Store{
	"memory": func(*testing.T) server.Store { return server.NewMemoryStore() },
	"sqlite": func(t *testing.T) server.Store { return openSQLite(t) },
}
