package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/server"
)

// ordersAPI is a server that honours idempotency keys: package server's
// middleware in front of a handler that creates orders. Close closes both.
type api struct {
	*httptest.Server
	mw *server.Middleware
}

func (a api) Close() { a.Server.Close(); a.mw.Close() }

func ordersAPI() (api, *atomic.Int32) {
	var created atomic.Int32
	mw, err := server.New(server.Config{Store: server.NewMemoryStore(), Scope: server.SingleTenant})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := created.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order_id":"ord_%d"}`, n)
	})))
	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
	return api{httptest.NewServer(mux), mw}, &created
}

// tempJournal opens a journal in a new temporary directory.
func tempJournal() (*idem.SQLiteJournal, func()) {
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		panic(err)
	}
	j, err := idem.OpenSQLite(filepath.Join(dir, "ops.db"))
	if err != nil {
		panic(err)
	}
	return j, func() { j.Close(); os.RemoveAll(dir) }
}

// Do journals the operation and its key, sends it, and returns the server's
// answer. Calling it again for the same operation ID returns the journaled
// answer without sending anything.
func Example() {
	orders, created := ordersAPI()
	defer orders.Close()
	j, cleanup := tempJournal()
	defer cleanup()

	c, err := idem.New(idem.Config{
		Journal: j,
		BaseURL: orders.URL,
		Status:  idem.StatusEndpoint(orders.URL + "/idempotency"),
	})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	ctx := context.Background()
	op := idem.Op{ID: "checkout/cart-42", URL: "/orders", Body: []byte(`{"item":"book","quantity":1}`)}
	res, err := c.Do(ctx, op)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.State, res.StatusCode, string(res.Body))

	again, err := c.Do(ctx, op)
	if err != nil {
		panic(err)
	}
	fmt.Println("same key:", again.Key == res.Key, "orders created:", created.Load())
	// Output:
	// succeeded 201 {"order_id":"ord_1"}
	// same key: true orders created: 1
}

// Begin journals an operation without sending it, so that the application
// can record its key first; Send sends it later, from this process or after
// a restart.
func ExampleClient_Begin() {
	orders, created := ordersAPI()
	defer orders.Close()
	j, cleanup := tempJournal()
	defer cleanup()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: orders.URL})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	ctx := context.Background()
	op, err := c.Begin(ctx, idem.Op{ID: "invoice/7/pay", URL: "/orders", Body: []byte(`{"item":"invoice-7"}`)})
	if err != nil {
		panic(err)
	}
	rec, _ := c.Lookup(ctx, "", "invoice/7/pay")
	fmt.Println("journaled:", rec.State, "key stable:", rec.Key == op.Key())

	res, err := op.Send(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("sent:", res.State, "orders created:", created.Load())
	// Output:
	// journaled: pending key stable: true
	// sent: succeeded orders created: 1
}

// An error from Do says what is known. Here nothing listens, so the
// operation is not sent: it stays journaled as pending, and a later Do (or
// Resume) sends it with the same key once the server is back.
func ExampleOperationError() {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there for now

	j, cleanup := tempJournal()
	defer cleanup()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: "http://" + addr,
		Retry: idem.RetryPolicy{MaxAttempts: 2}})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	ctx := context.Background()
	_, err = c.Do(ctx, idem.Op{ID: "checkout/cart-43", URL: "/orders", Body: []byte(`{"item":"pen"}`)})
	var oe *idem.OperationError
	if errors.Is(err, idem.ErrNotSent) && errors.As(err, &oe) {
		fmt.Println("not sent; journaled as", oe.State)
	}

	// The server comes back on the same address.
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	back := httptest.NewUnstartedServer(mux)
	back.Listener.Close()
	if back.Listener, err = net.Listen("tcp", addr); err != nil {
		panic(err)
	}
	back.Start()
	defer back.Close()

	res, err := c.Do(ctx, idem.Op{ID: "checkout/cart-43", URL: "/orders", Body: []byte(`{"item":"pen"}`)})
	if err != nil {
		panic(err)
	}
	fmt.Println("then:", res.State, res.StatusCode, "same key:", res.Key == oe.Key)
	// Output:
	// not sent; journaled as pending
	// then: succeeded 201 same key: true
}

// After a restart, Resume finishes what the journal holds: pending
// operations are sent, and operations whose outcome is unknown get a status
// check before anything is re-sent.
func ExampleClient_Resume() {
	orders, created := ordersAPI()
	defer orders.Close()
	j, cleanup := tempJournal()
	defer cleanup()
	ctx := context.Background()

	// A process journals two operations, then stops before sending them.
	before, err := idem.New(idem.Config{Journal: j, BaseURL: orders.URL})
	if err != nil {
		panic(err)
	}
	for _, id := range []string{"refund/r-1", "refund/r-2"} {
		if _, err := before.Begin(ctx, idem.Op{ID: id, URL: "/orders", Body: []byte(id)}); err != nil {
			panic(err)
		}
	}
	before.Close()

	// The restarted process resumes them.
	after, err := idem.New(idem.Config{Journal: j, BaseURL: orders.URL, Status: idem.StatusEndpoint(orders.URL + "/idempotency")})
	if err != nil {
		panic(err)
	}
	defer after.Close()
	rep, err := after.Resume(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("claimed %d, succeeded %d, remaining %d; orders created: %d\n",
		rep.Claimed, rep.Succeeded, rep.Remaining(), created.Load())
	// Output:
	// claimed 2, succeeded 2, remaining 0; orders created: 2
}
