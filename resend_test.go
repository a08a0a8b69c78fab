package idem_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A replay that checks the status (ReplayStatus) is an attempt, and when
// net/http sends it again by itself, after a server closed the reused
// connection having read it, that re-send is counted and journaled as the
// transport's, like an ordinary attempt's.
func TestTheTransportsResendOfAReplayIsCountedAndJournaled(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch n {
		case 1: // the warm-up: its connection stays in the pool
			w.WriteHeader(http.StatusCreated)
		case 2: // the attempt: in progress, on the reused connection
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusConflict)
		case 3: // the replay, read whole, and its connection closed
			dropConn(w)
		default: // net/http's own re-send, on a new connection
			w.WriteHeader(http.StatusCreated)
		}
	})
	policy := fastRetry()
	policy.MaxAttempts = 1
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy, Status: idem.ReplayStatus()})
	ctx := context.Background()
	_, err := c.Do(ctx, idem.Op{ID: "warm-up", URL: "/orders"})
	require.NoError(t, err)
	res, err := c.Do(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
	require.NoError(t, err)
	keys := srv.received()
	require.Len(t, keys, 4, "warm-up, attempt, replay, the transport's re-send of the replay")
	allSame(t, keys[1:], res.Key)
	assert.Equal(t, 2, res.Attempts, "the attempt and the replay")
	assert.Equal(t, 1, res.TransportResends, "the transport's re-send of the replay, counted apart")
	h, err := j.History(ctx, res.Key)
	require.NoError(t, err)
	told := 0
	for _, e := range h {
		if strings.Contains(e.Detail, "the transport sent it again 1 time(s) by itself") {
			told++
		}
	}
	assert.Equal(t, 1, told, "the history tells of the re-send once: %+v", h)
}
