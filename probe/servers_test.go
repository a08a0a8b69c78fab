package probe_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/probe"
	"github.com/idemkit/idem/server"
)

// api is an endpoint under test: a real HTTP server on 127.0.0.1 that
// counts the requests it received and the orders its handler created.
type api struct {
	srv      *httptest.Server
	requests atomic.Int64
	orders   atomic.Int64
	gate     gate
}

func (a *api) url(path string) string { return a.srv.URL + path }

// onStep holds the handler of the concurrent step's first request until
// the second has arrived, so that the two overlap whatever the scheduling.
func (a *api) onStep(s probe.Step) { a.gate.setOn(s.Name == probe.StepConcurrent) }

// start serves h behind a wrapper that counts requests and opens the gate.
func start(t *testing.T, a *api, h http.Handler) *api {
	t.Helper()
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.requests.Add(1)
		a.gate.arrive(keyOf(r))
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

// keyOf is the key a request carries, in whichever header and form.
func keyOf(r *http.Request) string {
	return r.Header.Get("Idempotency-Key") + "|" + r.Header.Get("X-Idempotency-Key")
}

// create is the application's handler: each run creates an order with a
// new ID.
func (a *api) create(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	a.gate.hold(r, keyOf(r))
	n := a.orders.Add(1)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order_id":"ord_%d","request_bytes":%d}`, n, len(body))
}

// gate holds a handler, while it is on, until a second request with the
// same key has arrived at the server; or, when it is manual, until the
// server's handler of that second request releases it, having seen the
// first still running (a release on arrival lets the first finish before
// the second looks, and the two no longer overlap).
type gate struct {
	mu     sync.Mutex
	on     bool
	manual bool
	second map[string]chan struct{}
	seen   map[string]int
}

// release lets the request held under key go.
func (g *gate) release(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ch := g.chanFor(key); !isClosed(ch) {
		close(ch)
	}
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (g *gate) setOn(on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.on = on
}

func (g *gate) chanFor(key string) chan struct{} {
	if g.second == nil {
		g.second, g.seen = map[string]chan struct{}{}, map[string]int{}
	}
	if g.second[key] == nil {
		g.second[key] = make(chan struct{})
	}
	return g.second[key]
}

func (g *gate) arrive(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ch := g.chanFor(key)
	if g.seen[key]++; g.seen[key] == 2 && !g.manual && !isClosed(ch) {
		close(ch)
	}
}

func (g *gate) hold(r *http.Request, key string) {
	g.mu.Lock()
	on, ch := g.on, g.chanFor(key)
	g.mu.Unlock()
	if on {
		select {
		case <-ch:
		case <-r.Context().Done():
		}
	}
}

// idemAPI is the server package's middleware in front of POST /orders
// and POST /refunds, with its status endpoint; header is the key header
// it reads ("" for the default).
func idemAPI(t *testing.T, header string) *api {
	t.Helper()
	a, mux := idemMux(t, header)
	return start(t, a, mux)
}

// idemMux is idemAPI's handler, not yet served.
func idemMux(t *testing.T, header string) (*api, http.Handler) {
	t.Helper()
	mw, err := server.New(server.Config{Store: server.NewMemoryStore(), Scope: server.SingleTenant, Header: header})
	require.NoError(t, err)
	t.Cleanup(func() { mw.Close() })
	a := &api{}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(a.create)))
	mux.Handle("POST /refunds", mw.Handler(http.HandlerFunc(a.create)))
	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
	return a, mux
}

// plainAPI has no idempotency at all: every request creates an order.
func plainAPI(t *testing.T) *api {
	a := &api{}
	return start(t, a, http.HandlerFunc(a.create))
}

// keyed is a small idempotency layer written here, configurable to behave
// as the middlewares of PROTOCOL.md do.
type keyed struct {
	a *api
	// header is the key header; checkPayload compares bodies, and
	// mismatch is the status of a refusal (with a JSON error body).
	header       string
	checkPayload bool
	mismatch     int
	// wait holds a request whose key is running until it finishes, then
	// replays; else it gets 409 (without Retry-After).
	wait bool
	// replayHeader marks replays, when set.
	replayHeader string
	// quotedOnly refuses a bare key with 400.
	quotedOnly bool
	// scopeByPath keys entries by method and path too.
	scopeByPath bool

	mu      sync.Mutex
	entries map[string]*entry
}

type entry struct {
	done   chan struct{}
	body   []byte
	status int
	answer []byte
}

func (k *keyed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw := r.Header.Get(k.header)
	if raw == "" || (k.quotedOnly && !strings.HasPrefix(raw, `"`)) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":"%s must be an sf-string"}`, k.header)
		return
	}
	key, err := wire.ParseKey(raw)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if k.scopeByPath {
		key = r.Method + " " + r.URL.Path + " " + key
	}
	body, _ := io.ReadAll(r.Body)
	k.mu.Lock()
	if k.entries == nil {
		k.entries = map[string]*entry{}
	}
	e, found := k.entries[key]
	if !found {
		e = &entry{done: make(chan struct{}), body: body}
		k.entries[key] = e
	}
	k.mu.Unlock()
	if found {
		select {
		case <-e.done:
			k.a.gate.release(keyOf(r))
		default:
			// Seen running: the first may go on now.
			k.a.gate.release(keyOf(r))
			if !k.wait {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusConflict)
				io.WriteString(w, `{"error":"request in progress"}`)
				return
			}
			<-e.done
		}
		if k.checkPayload && !bytes.Equal(e.body, body) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(k.mismatch)
			io.WriteString(w, `{"error":"the key was used with another request"}`)
			return
		}
		if k.replayHeader != "" {
			w.Header().Set(k.replayHeader, "true")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(e.status)
		w.Write(e.answer)
		return
	}
	rec := httptest.NewRecorder()
	r.Body = io.NopCloser(bytes.NewReader(body))
	k.a.create(rec, r)
	e.status, e.answer = rec.Code, rec.Body.Bytes()
	close(e.done)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	w.Write(e.answer)
}

func keyedAPI(t *testing.T, k *keyed) *api {
	a := &api{gate: gate{manual: true}}
	k.a = a
	if k.header == "" {
		k.header = "Idempotency-Key"
	}
	return start(t, a, k)
}
