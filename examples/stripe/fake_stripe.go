package main

// Demo scaffolding: a fake Stripe API speaking the one endpoint the demo
// uses, POST /v1/payment_intents (form-encoded, Bearer secret key, JSON
// answers and errors in Stripe's shapes), behind idem's server middleware,
// which honours Idempotency-Key and replays stored answers as Stripe does.
// It can lose the answer to the next payment after committing it, or hold
// it until the client goes away.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"

	"github.com/idemkit/idem/server"
)

// secretKey is the fake API's only valid key.
const secretKey = "sk_test_idem_demo"

type paymentIntent struct {
	ID       string            `json:"id"`
	Object   string            `json:"object"`
	Amount   int64             `json:"amount"`
	Currency string            `json:"currency"`
	Status   string            `json:"status"`
	Metadata map[string]string `json:"metadata"`
}

type fakeStripe struct {
	*httptest.Server
	mw *server.Middleware

	mu      sync.Mutex
	intents []paymentIntent
	posts   int
	keys    map[string]bool // the Idempotency-Keys the API saw
	drop    bool            // lose the answer to the next payment, after committing it
	hold    bool            // hold the answer to the next payment until the client goes away
	created chan string     // the ID of each PaymentIntent created
}

func startFakeStripe() (*fakeStripe, error) {
	s := &fakeStripe{keys: map[string]bool{}, created: make(chan string, 16)}
	mw, err := server.New(server.Config{Store: server.NewMemoryStore(), Scope: server.SingleTenant})
	if err != nil {
		return nil, err
	}
	s.mw = mw
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payment_intents", s.faults(mw.Handler(http.HandlerFunc(s.createIntent))))
	s.Server = httptest.NewServer(s.authenticated(mux))
	return s, nil
}

func (s *fakeStripe) Close() { s.Server.Close(); s.mw.Close() }

// authenticated answers 401 in Stripe's shape without the secret key.
func (s *fakeStripe) authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+secretKey {
			stripeError(w, http.StatusUnauthorized, "invalid_request_error", "Invalid API Key provided.")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// faults loses or holds the answer to the next payment, after the
// middleware has stored it.
func (s *fakeStripe) faults(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.posts++
		s.keys[r.Header.Get("Idempotency-Key")] = true
		drop, hold := s.drop, s.hold
		s.drop, s.hold = false, false
		s.mu.Unlock()
		if !drop && !hold {
			next.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r) // committed and stored: the answer is what gets lost
		if hold {
			<-r.Context().Done()
		}
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
	})
}

func (s *fakeStripe) createIntent(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		stripeError(w, http.StatusBadRequest, "invalid_request_error", "Invalid form body.")
		return
	}
	amount, err := strconv.ParseInt(r.PostForm.Get("amount"), 10, 64)
	if err != nil || amount <= 0 {
		stripeError(w, http.StatusBadRequest, "invalid_request_error", "Missing required param: amount.")
		return
	}
	s.mu.Lock()
	pi := paymentIntent{ID: fmt.Sprintf("pi_%d", len(s.intents)+1), Object: "payment_intent", Amount: amount,
		Currency: r.PostForm.Get("currency"), Status: "requires_payment_method",
		Metadata: map[string]string{"invoice": r.PostForm.Get("metadata[invoice]")}}
	s.intents = append(s.intents, pi)
	s.mu.Unlock()
	s.created <- pi.ID
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_"+pi.ID)
	_ = json.NewEncoder(w).Encode(pi)
}

func stripeError(w http.ResponseWriter, code int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"type": typ, "message": msg}})
}

// counts returns the PaymentIntents created, the POSTs received and the
// distinct keys they carried.
func (s *fakeStripe) counts() (intents, posts, keys int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.intents), s.posts, len(s.keys)
}

func (s *fakeStripe) loseNextAnswer() { s.mu.Lock(); s.drop = true; s.mu.Unlock() }
func (s *fakeStripe) holdNextAnswer() { s.mu.Lock(); s.hold = true; s.mu.Unlock() }
