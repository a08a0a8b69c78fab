package main

// The demo shop: the orders application behind idem's server middleware,
// on 127.0.0.1, in the parent process, so that it outlives the crash of the
// application. It holds the answer of one order, so that the application
// can be killed while that order is on the wire. This is scaffolding, not
// something a client application would copy: main.go is.

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/internal/orders"
	"github.com/idemkit/idem/server"
)

// shop is the running demo server. It is safe for concurrent use.
type shop struct {
	// URL is the shop's base URL, such as http://127.0.0.1:41234.
	URL string

	app    *orders.App
	mw     *server.Middleware
	api    http.Handler // orders.Mux: POST /orders behind the middleware, GET /idempotency/{key}
	srv    *http.Server
	served chan error
	stop   chan struct{} // lets held answers go at shutdown

	orderRequests  atomic.Int64 // POST /orders requests that reached the shop
	statusRequests atomic.Int64 // GET /idempotency/{key} requests

	mu      sync.Mutex
	holdN   int  // the POST /orders whose answer is held, counting from 1
	holding bool // that answer is stored and being held
}

// startShop starts the shop with its orders database in dir.
func startShop(dir string) (*shop, error) {
	app, err := orders.New(filepath.Join(dir, "orders.db"))
	if err != nil {
		return nil, err
	}
	mw, err := server.New(server.Config{
		Store: server.NewMemoryStore(), // server.OpenSQLiteStore in a real service
		Scope: orders.Tenant,
	})
	if err != nil {
		app.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		mw.Close()
		app.Close()
		return nil, err
	}
	s := &shop{
		URL: "http://" + ln.Addr().String(),
		app: app, mw: mw, api: orders.Mux(app, mw),
		served: make(chan error, 1),
		stop:   make(chan struct{}),
	}
	s.srv = &http.Server{
		Handler:           http.HandlerFunc(s.serve),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0), // the dropped connections are on purpose
	}
	go func() { s.served <- s.srv.Serve(ln) }()
	return s, nil
}

// Close stops the shop: held answers are let go, then the server, the
// middleware and the database are closed.
func (s *shop) Close() error {
	close(s.stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serr := <-s.served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return errors.Join(err, s.mw.Close(), s.app.Close())
}

// Orders returns how many orders the shop's database holds.
func (s *shop) Orders(ctx context.Context) (int, error) { return s.app.TotalOrders(ctx) }

// OrderRequests returns how many POST /orders requests reached the shop.
func (s *shop) OrderRequests() int { return int(s.orderRequests.Load()) }

// StatusRequests returns how many status requests reached the shop.
func (s *shop) StatusRequests() int { return int(s.statusRequests.Load()) }

// HoldAnswerOf makes the nth POST /orders (counting from 1) go through
// the middleware in full (the order is created and its answer stored
// under the key), and then hold its answer until the client goes away.
func (s *shop) HoldAnswerOf(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holdN = n
}

// Holding reports whether the answer chosen by HoldAnswerOf is stored
// under its key and being held.
func (s *shop) Holding() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holding
}

func (s *shop) serve(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/orders":
		n := s.orderRequests.Add(1)
		s.mu.Lock()
		hold := int(n) == s.holdN
		s.mu.Unlock()
		if hold {
			commit(s.api, r)
			s.mu.Lock()
			s.holding = true
			s.mu.Unlock()
			select {
			case <-r.Context().Done(): // the client went away
			case <-s.stop:
			}
			drop(w)
			return
		}
	case strings.HasPrefix(r.URL.Path, "/idempotency/"):
		s.statusRequests.Add(1)
	}
	s.api.ServeHTTP(w, r)
}

// commit runs the request through the middleware and the orders handler to
// the end, into a recorder: the order is created and the answer stored
// under the key, but nothing is sent to the client.
func commit(api http.Handler, r *http.Request) {
	api.ServeHTTP(httptest.NewRecorder(), r)
}

// drop closes the client's connection without an answer.
func drop(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler) // net/http closes the connection
	}
	conn.Close()
}
