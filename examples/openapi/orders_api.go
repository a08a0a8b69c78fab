package main

// Demo scaffolding: examples/server's orders API (package orders behind
// idem's server middleware, keys and orders in SQLite files), with a fault
// layer that can lose the answer to the next order after it was committed,
// or hold it until the client goes away.

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"

	"github.com/idemkit/idem/examples/server/orders"
	"github.com/idemkit/idem/server"
)

type ordersAPI struct {
	*httptest.Server
	app   *orders.App
	store *server.SQLiteStore
	mw    *server.Middleware

	mu      sync.Mutex
	posts   int
	keys    map[string]bool // the Idempotency-Keys POST /orders saw
	drop    bool
	hold    bool
	arrived chan struct{} // one for each order committed under a fault
}

func startOrdersAPI(dir string) (*ordersAPI, error) {
	store, err := server.OpenSQLiteStore(filepath.Join(dir, "keys.db"))
	if err != nil {
		return nil, err
	}
	app, err := orders.New(filepath.Join(dir, "orders.db"))
	if err != nil {
		store.Close()
		return nil, err
	}
	mw, err := server.New(server.Config{Store: store, Scope: orders.Tenant})
	if err != nil {
		app.Close()
		store.Close()
		return nil, err
	}
	a := &ordersAPI{app: app, store: store, mw: mw, keys: map[string]bool{}, arrived: make(chan struct{}, 4)}
	a.Server = httptest.NewServer(a.faults(orders.Mux(app, mw)))
	return a, nil
}

func (a *ordersAPI) Close() {
	a.Server.Close()
	a.mw.Close()
	a.app.Close()
	a.store.Close()
}

// faults loses or holds the answer to the next POST /orders, after the
// order was committed and the answer stored.
func (a *ordersAPI) faults(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		a.mu.Lock()
		a.posts++
		a.keys[r.Header.Get("Idempotency-Key")] = true
		drop, hold := a.drop, a.hold
		a.drop, a.hold = false, false
		a.mu.Unlock()
		if !drop && !hold {
			next.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(httptest.NewRecorder(), r)
		a.arrived <- struct{}{}
		if hold {
			<-r.Context().Done()
		}
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
	})
}

func (a *ordersAPI) loseNextAnswer() { a.mu.Lock(); a.drop = true; a.mu.Unlock() }
func (a *ordersAPI) holdNextAnswer() { a.mu.Lock(); a.hold = true; a.mu.Unlock() }

// counts returns the POSTs received and the distinct keys they carried.
func (a *ordersAPI) counts() (posts, keys int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.posts, len(a.keys)
}
