package main

// The demo payments service: POST /payments behind idem's server
// middleware, on 127.0.0.1, keeping a ledger of the payments it made. This
// is scaffolding, not something a batch job would copy: main.go is.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/server"
)

// bank is the running demo service. It is safe for concurrent use.
type bank struct {
	// URL is the service's base URL, such as http://127.0.0.1:41234.
	URL string

	mw     *server.Middleware
	srv    *http.Server
	served chan error

	requests atomic.Int64 // POST /payments requests that reached the service

	mu     sync.Mutex
	ledger map[string][]byte // the payments made, by idempotency key
}

// payment is the body of POST /payments.
type payment struct {
	Employee    string `json:"employee"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Period      string `json:"period"`
}

// startBank starts the service.
func startBank() (*bank, error) {
	mw, err := server.New(server.Config{
		// The server keeps keys for 24 h by default: a re-run within that
		// window is answered from this store. server.OpenSQLiteStore keeps
		// them across the service's restarts.
		Store: server.NewMemoryStore(),
		// The payroll job is the bank's only caller here; a real bank
		// scopes keys by the authenticated account.
		Scope: server.SingleTenant,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		mw.Close()
		return nil, err
	}
	b := &bank{URL: "http://" + ln.Addr().String(), mw: mw, served: make(chan error, 1), ledger: map[string][]byte{}}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(b.pay)))
	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
	b.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && r.URL.Path == "/payments" {
				b.requests.Add(1)
			}
			mux.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	go func() { b.served <- b.srv.Serve(ln) }()
	return b, nil
}

// Close stops the service.
func (b *bank) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := b.srv.Shutdown(ctx)
	if serr := <-b.served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return errors.Join(err, b.mw.Close())
}

// Payments returns how many payments the service made.
func (b *bank) Payments() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.ledger)
}

// Requests returns how many POST /payments requests reached the service.
func (b *bank) Requests() int { return int(b.requests.Load()) }

// pay makes a payment. It sits behind the middleware, which runs it once
// per key; the ledger is keyed by the idempotency key as well (the second
// guard that the server package recommends), so a run that somehow comes
// twice answers with the first payment instead of paying again.
func (b *bank) pay(w http.ResponseWriter, r *http.Request) {
	key, ok := server.KeyFromContext(r.Context())
	if !ok {
		http.Error(w, "the payments handler runs behind the idempotency middleware", http.StatusInternalServerError)
		return
	}
	var p payment
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Employee == "" || p.AmountCents <= 0 {
		http.Error(w, "the body must be a payment with an employee and a positive amount", http.StatusBadRequest)
		return
	}
	b.mu.Lock()
	receipt, done := b.ledger[key]
	if !done {
		receipt, _ = json.Marshal(map[string]any{
			"payment_id": fmt.Sprintf("pay_%03d", len(b.ledger)+1),
			"employee":   p.Employee, "amount_cents": p.AmountCents, "currency": p.Currency, "period": p.Period,
		})
		b.ledger[key] = receipt
	}
	b.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(receipt)
}
