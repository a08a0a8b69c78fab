package idem_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// An operation parked because the server does not honour keys (a cut 201,
// then not_found) answers ErrKeyNotHonoured to the call that parked it. A
// later call of the same operation (the application's retry of the same
// ID, after a restart) reads the parked record: its error says "the server
// does not honour idempotency keys" in its text but no longer matches
// ErrKeyNotHonoured, only ErrNeedsReconciliation, so an application that
// alerts on a possible duplicate by errors.Is misses it. A key conflict is
// kept across calls (its note in LastError); this is not.
func TestAParkedKeyNotHonouredIsStillKeyNotHonouredOnALaterCall(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	var executions atomic.Int32
	srv := cutSuccessServer(t, &down, &executions)
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/idempotency"), Retry: fastRetry()})
	ctx := context.Background()
	_, err := c.Do(ctx, orderOp("op-1", 1))
	require.ErrorIs(t, err, idem.ErrKeyNotHonoured, "the call that parked it")

	_, err = c.Do(ctx, orderOp("op-1", 1))
	require.ErrorIs(t, err, idem.ErrNeedsReconciliation)
	assert.ErrorIs(t, err, idem.ErrKeyNotHonoured, "a later Do of the parked operation")

	op, err := c.Begin(ctx, orderOp("op-1", 1))
	require.NoError(t, err)
	_, err = op.Send(ctx)
	assert.ErrorIs(t, err, idem.ErrKeyNotHonoured, "Send of the parked operation")
	assert.Equal(t, int32(1), executions.Load())
}
