package idem_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestRetryAfterBeyondInt64IsNotCutToZero: delay-seconds is 1*DIGIT (RFC
// 9110 10.2.3), so "99999999999999999999" is a valid, very long wait. A
// value that fits int64 is capped at 24h, one that does not must not read
// as "no wait": doc.go promises a server's Retry-After is never cut short,
// and zero makes the client send again at once.
func TestRetryAfterBeyondInt64IsNotCutToZero(t *testing.T) {
	t.Parallel()
	now := time.Now()
	const huge = "99999999999999999999"
	assert.Equal(t, 24*time.Hour, idem.RetryAfter(http.Header{"Retry-After": {"9999999999"}}, now), "fits int64: capped")
	assert.Equal(t, 24*time.Hour, idem.RetryAfter(http.Header{"Retry-After": {huge}}, now), "beyond int64: read as no wait at all")

	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", huge)
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
	_, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders"})
	require.Error(t, err)
	assert.Len(t, srv.received(), 1, "the server asked to wait (Retry-After %s); the client sent again at once: %v", huge, err)
}
