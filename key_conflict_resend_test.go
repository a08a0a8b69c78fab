package idem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A key conflict answering a retry, after an earlier attempt of the same
// operation reached the server, is about that earlier attempt: the client
// sends nothing else under the key. Here a gateway answers 502 after the
// server applied the first attempt, and the retry carries a fresh token in
// its query (Authorize), which the server counts in the request it keeps
// for the key. The outcome is unknown, not rejected: the status endpoint
// settles it with the server's stored 201.
func TestAKeyConflictAnsweringARetryIsSettledByTheStatusCheck(t *testing.T) {
	t.Parallel()
	var (
		mu       sync.Mutex
		seen     = map[string]string{}
		executed atomic.Int32
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if key, ok := strings.CutPrefix(r.URL.Path, "/idempotency/"); ok {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"key":%q,"state":"completed","response":{"status":201,"body":"{\"order_id\":\"o-1\"}"}}`, key)
			return
		}
		body, _ := io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		req := r.Method + " " + r.URL.RequestURI() + " " + string(body)
		mu.Lock()
		first, ok := seen[key]
		if !ok {
			seen[key] = req
		}
		mu.Unlock()
		switch {
		case !ok:
			executed.Add(1)
			w.WriteHeader(http.StatusBadGateway) // applied; the gateway lost the answer
		case first != req:
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusUnprocessableEntity)
			fmt.Fprint(w, `{"type":"urn:idem:problem:key-reused","title":"key reused with another request"}`)
		default:
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
		}
	}))
	t.Cleanup(srv.Close)
	var tokens atomic.Int32
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), Status: idem.StatusEndpoint(srv.URL + "/idempotency"),
		Authorize: func(r *http.Request) error {
			q := r.URL.Query()
			q.Set("access_token", fmt.Sprintf("tok-%d", tokens.Add(1)))
			r.URL.RawQuery = q.Encode()
			return nil
		}})
	res, err := c.Do(context.Background(), orderOp("op-1", 1))
	assert.Equal(t, int32(1), executed.Load())
	require.NoError(t, err, "an applied write, whose retry met a key conflict")
	assert.Equal(t, http.StatusCreated, res.StatusCode)
	assert.Equal(t, `{"order_id":"o-1"}`, string(res.Body))
}
