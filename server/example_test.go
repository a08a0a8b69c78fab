package server_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idem/server"
)

// Mount the middleware in front of the state-changing routes and the status
// endpoint beside them.
func ExampleNew() {
	mw, err := server.New(server.Config{
		Store: server.NewMemoryStore(), // OpenSQLiteStore in production
		// The caller's tenant: keys never cross it.
		Scope: func(r *http.Request) string { return r.Header.Get("X-Tenant") },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer mw.Close()

	orders := 0
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order_id":"ord_%d"}`, orders)
	})

	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(createOrder))
	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
	srv := httptest.NewServer(mux)
	defer srv.Close()

	send := func(method, path, body string) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		req.Header.Set("X-Tenant", "acme")
		resp, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b))
	}
	send("POST", "/orders", `{"item":"book"}`)
	send("POST", "/orders", `{"item":"book"}`) // a retry: replayed, not run again
	send("POST", "/orders", `{"item":"pen"}`)  // the key reused for another payload
	send("GET", "/idempotency/8e03978e-40d5-43e8-bc93-6894a57f9324", "")
	fmt.Println("orders created:", orders)
	// Output:
	// 201  {"order_id":"ord_1"}
	// 201 true {"order_id":"ord_1"}
	// 422  {"type":"urn:idem:problem:key-reused","title":"Idempotency key reused","status":422,"detail":"This idempotency key was already used with a different request body or query; use a new key for a new operation.","key":"8e03978e-40d5-43e8-bc93-6894a57f9324"}
	// 200  {"key":"8e03978e-40d5-43e8-bc93-6894a57f9324","state":"completed","response":{"status":201,"header":{"Content-Type":["application/json"]},"body":"{\"order_id\":\"ord_1\"}"}}
	// orders created: 1
}

// KeyFromContext lets the application keep the key with its own record
// under a UNIQUE constraint: the second guard, for a handler that runs
// again after its first run died past its own commit.
func ExampleKeyFromContext() {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, _ := server.KeyFromContext(r.Context())
		// INSERT INTO orders (tenant, idem_key, …) VALUES (?, ?, …)
		// with UNIQUE (tenant, idem_key); on a conflict, answer with the
		// existing order instead of creating one.
		fmt.Println("handling key", key)
	})
	mw, err := server.New(server.Config{Store: server.NewMemoryStore(), Scope: server.SingleTenant})
	if err != nil {
		log.Fatal(err)
	}
	defer mw.Close()
	req := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", `"quoted-or-bare"`)
	mw.Handler(handler).ServeHTTP(httptest.NewRecorder(), req)
	// Output:
	// handling key quoted-or-bare
}
