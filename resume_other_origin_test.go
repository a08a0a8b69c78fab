package idem_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// "A client's Resume drives only its own scope and origin (its credentials
// belong to them)", and the standard client refuses an operation to
// another origin than BaseURL's before anything is journaled or sent ("a
// client's operations, credentials and Resume belong to its BaseURL: use a
// client for that API"). Do takes an absolute Op.URL to another origin,
// sends it with Authorize's credentials, and when its outcome is unknown
// the client's Resume never takes it up: the operation is left behind.
// Either Do refuses it as the standard client does, or Resume finishes it.
func TestDoToAnotherOriginIsRefusedOrResumed(t *testing.T) {
	t.Parallel()
	api := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	var lose atomic.Bool
	lose.Store(true)
	other := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		if lose.Load() {
			dropConn(w)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	c, _ := newClient(t, idem.Config{BaseURL: api.URL, Retry: fastRetry(),
		Authorize: func(r *http.Request) error { r.Header.Set("Authorization", "Bearer for-the-api"); return nil }})
	ctx := context.Background()
	op := orderOp("op-1", 1)
	op.URL = other.URL + "/orders"
	_, err := c.Do(ctx, op)
	if errors.Is(err, idem.ErrInvalidOp) {
		assert.Empty(t, other.received(), "refused, but after sending")
		return
	}
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	lose.Store(false)
	rep, err := c.Resume(ctx, idem.ResumeWait())
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Claimed, "Do sent it (%d write(s) to %s), Resume of the same client leaves it: %+v", len(other.received()), other.URL, rep)
}
