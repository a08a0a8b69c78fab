package idem_test

import (
	"context"
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

// A status endpoint that is overloaded says so as any server does: 503
// (or 429) with Retry-After. The client honours Retry-After on attempts
// ("the next attempt is scheduled at the server's time", and a wait longer
// than MaxRetryAfter ends the call, due again then); a status check is a
// request to the same server and must be held to the same rule: no check
// before the server's time, within the call or by Resume. Here the status
// endpoint asks for an hour; the client asks again at once, MaxStatusChecks
// times, and leaves the operation due again after its own short backoff.
func TestAStatusEndpointsRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	var checks atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/idempotency/") {
			checks.Add(1)
			w.Header().Set("Retry-After", "3600")
			http.Error(w, "overloaded, come back in an hour", http.StatusServiceUnavailable)
			return
		}
		dropConn(w)
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/idempotency"), Retry: fastRetry()})
	ctx := context.Background()
	before := time.Now()
	_, err := c.Do(ctx, orderOp("op-1", 1))
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	assert.Equal(t, int32(1), checks.Load(), "status checks sent within the hour the status endpoint asked for")
	rec, err := c.Lookup(ctx, "default", "op-1")
	require.NoError(t, err)
	assert.False(t, rec.NextAttemptAt.Before(before.Add(time.Hour)),
		"the operation is due again at %s, before the status endpoint's Retry-After (%s)", rec.NextAttemptAt.Format(time.RFC3339Nano), before.Add(time.Hour).Format(time.RFC3339))
}
