package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// processingAPI commits nothing it can answer (the connection of every
// write is dropped: the outcome is unknown) and its status endpoint says
// "processing" for ever, as a server does while it holds a key's lock.
func processingAPI(t *testing.T) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var checks atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			checks.Add(1)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"key":%q,"state":"processing"}`, strings.TrimPrefix(r.URL.Path, "/idempotency/"))
			return
		}
		dropConn(w)
	}))
	t.Cleanup(srv.Close)
	return srv, &checks
}

// Under a context deadline, a call waits for a server that says it is
// still processing until the deadline: RetryPolicy.MaxStatusChecks and
// Budget bound calls without one. The error says which bound ended the
// wait.
func TestTheCallersDeadlineGovernsTheWaitForProcessing(t *testing.T) {
	t.Parallel()
	policy := idem.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, MaxAttempts: 1, MaxStatusChecks: 2}

	t.Run("with a deadline", func(t *testing.T) {
		t.Parallel()
		srv, checks := processingAPI(t)
		p := policy
		p.Budget = 50 * time.Millisecond // shorter than the deadline: the deadline wins
		c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/idempotency"), Retry: p})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.Do(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.Greater(t, checks.Load(), int32(p.MaxStatusChecks), "the checks stopped at RetryPolicy.MaxStatusChecks under a deadline: %v", err)
		assert.ErrorIs(t, err, context.DeadlineExceeded, "the error names the deadline as what ended the wait")
		assert.NotContains(t, err.Error(), "MaxStatusChecks")
		assert.NotContains(t, err.Error(), "RetryPolicy.Budget")
		assert.Contains(t, err.Error(), "processing", "the error says what the server said")
	})
	t.Run("without a deadline", func(t *testing.T) {
		t.Parallel()
		srv, checks := processingAPI(t)
		c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/idempotency"), Retry: policy})
		_, err := c.Do(context.Background(), idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		assert.Equal(t, int32(policy.MaxStatusChecks), checks.Load())
		assert.Contains(t, err.Error(), "RetryPolicy.MaxStatusChecks", "the error names the bound that ended the wait")
		assert.NotErrorIs(t, err, context.DeadlineExceeded)
	})
}
