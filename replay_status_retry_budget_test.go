package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// The retry budget (RetryRatio, MinRetriesPerSecond) exists "so that an
// outage does not turn into a retry storm: ... every re-send spends one".
// ReplayStatus, the default status checker, settles an unknown outcome by
// re-sending the journaled request, same key and bytes: a re-send, counted
// as an attempt, as heavy for the server as a retry. A budget that allows
// no re-send at all must stop those too; here a server whose answers are
// all lost (an outage behind a proxy) receives one write per replay, up to
// MaxStatusChecks, whatever the budget, and every operation of the client
// does the same.
func TestReplayStatusSpendsTheRetryBudget(t *testing.T) {
	t.Parallel()
	var writes atomic.Int32
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		writes.Add(1)
		dropConn(w)
	})
	policy := fastRetry()
	// A budget that holds less than one token, and refills one in 1000 s:
	// no re-send within this test.
	policy.RetryRatio, policy.MinRetriesPerSecond = 0.001, 0.001
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy})

	// The budget is in force: a 503, which the client retries with the
	// same key, is not re-sent.
	busy := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	c503, _ := newClient(t, idem.Config{BaseURL: busy.URL, Retry: policy, Status: idem.StatusEndpoint(busy.URL + "/idempotency")})
	_, err := c503.Do(context.Background(), orderOp("op-503", 1))
	require.ErrorIs(t, err, idem.ErrRetryBudgetExhausted)
	require.Len(t, busy.received(), 1, "the budget let a 503 be re-sent")

	_, err = c.Do(context.Background(), orderOp("op-1", 1))
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	assert.Equal(t, int32(1), writes.Load(), fmt.Sprintf("writes of one operation received by the server with a retry budget that allows no re-send (%v)", err))
}

// The same budget and a status endpoint that says the server never saw the
// key: each not_found is followed by a send of the request again, same
// key, and those re-sends are not held to the budget either: MaxAttempts
// writes reach a server in an outage, whatever the budget.
func TestResendAfterNotFoundSpendsTheRetryBudget(t *testing.T) {
	t.Parallel()
	var writes atomic.Int32
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if key, ok := strings.CutPrefix(r.URL.Path, "/idempotency/"); ok {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"key":%q,"state":"not_found"}`, key)
			return
		}
		writes.Add(1)
		dropConn(w)
	})
	policy := fastRetry()
	policy.RetryRatio, policy.MinRetriesPerSecond = 0.001, 0.001
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy, Status: idem.StatusEndpoint(srv.URL + "/idempotency")})
	_, err := c.Do(context.Background(), orderOp("op-1", 1))
	require.Error(t, err)
	assert.Equal(t, int32(1), writes.Load(), fmt.Sprintf("writes of one operation received by the server with a retry budget that allows no re-send (%v)", err))
}
