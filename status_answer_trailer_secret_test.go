package idem_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/server"
)

// TestStatusAnswerTrailerNamedLikeASecretIsNeverJournaled: the server
// middleware stores a trailer its handler set under net/http's
// TrailerPrefix form ("Trailer:X-Session-Token") in the response's header,
// and its status endpoint sends that header as it is. The client drops a
// Config.SecretHeaders name from every stored answer whatever its case
// (dropSecrets), but "Trailer:X-Session-Token" is neither the secret's name
// nor one CanonicalHeaderKey maps to it (the colon makes it no token): a
// secret the handler sent as a trailer is journaled in clear and returned
// in Result.Header when the answer is recovered through the status
// endpoint. (Sent directly, the same answer's trailer never reaches the
// Result: one answer, two contents.)
func TestStatusAnswerTrailerNamedLikeASecretIsNeverJournaled(t *testing.T) {
	t.Parallel()
	const secret = "tok_1a2b3c4d5e6f7a8b"
	mw, err := server.New(server.Config{Store: server.NewMemoryStore(), Scope: server.SingleTenant})
	require.NoError(t, err)
	t.Cleanup(func() { _ = mw.Close() })
	orders := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Session-Token")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"o1"}`)
		w.Header().Set("X-Session-Token", secret) // the announced trailer
	}))
	var posts atomic.Int32
	mux := http.NewServeMux()
	mux.Handle("POST /orders", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if posts.Add(1) == 1 {
			// The handler runs and its answer is stored, but the answer
			// is lost on its way: the client asks the status endpoint.
			orders.ServeHTTP(httptest.NewRecorder(), r)
			dropConn(w)
			return
		}
		orders.ServeHTTP(w, r)
	}))
	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	c, j := newClient(t, idem.Config{
		BaseURL:       srv.URL,
		Status:        idem.StatusEndpoint(srv.URL + "/idempotency"),
		Retry:         fastRetry(),
		SecretHeaders: []string{"X-Session-Token"},
	})
	res, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders", Body: []byte(`{"n":1}`)})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	assert.Equal(t, int32(1), posts.Load(), "the answer came from the status endpoint")
	for name, v := range res.Header {
		assert.NotContains(t, strings.Join(v, ","), secret, "Result.Header[%q] carries the secret", name)
	}
	require.NoError(t, j.Close())
	assertJournalHoldsNo(t, j, secret)
}
