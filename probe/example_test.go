package probe_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"github.com/idemkit/idem/probe"
	"github.com/idemkit/idem/server"
)

// Probe an API before trusting it: here the server package's middleware
// in front of a handler that creates orders, with its status endpoint.
func ExampleRun() {
	mw, err := server.New(server.Config{Store: server.NewMemoryStore(), Scope: server.SingleTenant})
	if err != nil {
		log.Fatal(err)
	}
	defer mw.Close()
	var orders atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order_id":"ord_%d"}`, orders.Add(1))
	})))
	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
	srv := httptest.NewServer(mux)
	defer srv.Close()

	rep, err := probe.Run(context.Background(), probe.Config{
		URL:       srv.URL + "/orders",
		Body:      []byte(`{"item":"book","quantity":1}`),
		Header:    http.Header{"Authorization": {"Bearer test-token"}}, // sent, never reported
		StatusURL: srv.URL + "/idempotency/{key}",
		OnStep: func(s probe.Step) {
			fmt.Printf("step %d: sends %d requests (%s)\n", s.N, s.Requests, s.Name)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range rep.Findings {
		fmt.Printf("%-14s %s\n", f.Step, f.Grade)
	}
	fmt.Println("verdict:", rep.Verdict.Describe())
	fmt.Println("requests:", rep.Requests, "of", rep.MaxRequests)
	fmt.Println("status checker set:", rep.Advice.Status != "")
	// Output:
	// step 1: sends 2 requests (replay)
	// step 2: sends 2 requests (mismatch)
	// step 3: sends 2 requests (concurrent)
	// step 5: sends 2 requests (status)
	// step 6: sends 2 requests (key-form)
	// replay         ok
	// mismatch       ok
	// concurrent     ok
	// other-endpoint skipped
	// status         ok
	// key-form       ok
	// verdict: safe to use with idem
	// requests: 10 of 20
	// status checker set: true
}
