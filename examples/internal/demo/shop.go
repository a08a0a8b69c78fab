package demo

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

	"github.com/idemkit/idem/examples/server/orders"
	"github.com/idemkit/idem/server"
)

// Shop is the demo server: the orders application behind idem's server
// middleware on 127.0.0.1, which can lose or hold the answer of a chosen
// order. It is safe for concurrent use.
type Shop struct {
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

	mu     sync.Mutex
	faults map[int64]func(http.ResponseWriter, *http.Request) // by POST /orders number, from 1
}

// StartShop starts the shop with its orders database in dir.
func StartShop(dir string) (*Shop, error) {
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
	s := &Shop{
		URL: "http://" + ln.Addr().String(),
		app: app, mw: mw, api: orders.Mux(app, mw),
		served: make(chan error, 1),
		stop:   make(chan struct{}),
		faults: map[int64]func(http.ResponseWriter, *http.Request){},
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
func (s *Shop) Close() error {
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
func (s *Shop) Orders(ctx context.Context) (int, error) { return s.app.TotalOrders(ctx) }

// OrderRequests returns how many POST /orders requests reached the shop.
func (s *Shop) OrderRequests() int { return int(s.orderRequests.Load()) }

// StatusRequests returns how many status requests reached the shop.
func (s *Shop) StatusRequests() int { return int(s.statusRequests.Load()) }

// DropAnswerOf makes the nth POST /orders (counting from 1) go through the
// middleware in full (the order is created and its answer stored under the
// key), and then closes the connection instead of answering: the answer is
// lost on the way back.
func (s *Shop) DropAnswerOf(n int) {
	s.setFault(n, func(w http.ResponseWriter, r *http.Request) {
		commit(s.api, r)
		drop(w)
	})
}

// HoldAnswerOf makes the nth POST /orders go through the middleware in
// full, and then holds its answer until the client goes away. The returned
// channel is closed once the order is created and its answer stored.
func (s *Shop) HoldAnswerOf(n int) <-chan struct{} {
	held := make(chan struct{})
	s.setFault(n, func(w http.ResponseWriter, r *http.Request) {
		commit(s.api, r)
		close(held)
		select {
		case <-r.Context().Done(): // the client went away
		case <-s.stop:
		}
		drop(w)
	})
	return held
}

func (s *Shop) setFault(n int, f func(http.ResponseWriter, *http.Request)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[int64(n)] = f
}

func (s *Shop) serve(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/orders":
		n := s.orderRequests.Add(1)
		s.mu.Lock()
		f := s.faults[n]
		delete(s.faults, n)
		s.mu.Unlock()
		if f != nil {
			f(w, r)
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
