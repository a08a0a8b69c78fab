package idem_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// The proof of a cut success is journaled with the operation, not kept by
// the client that saw it: another client on the same SQLite file keeps it
// through a Send whose status checks fail again, and its Resume then parks
// the operation on not_found, with ErrKeyNotHonoured for the later Do too.
func TestACutSuccessProofSurvivesAnotherClientsUnsettledSend(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	var executions atomic.Int32
	down.Store(true)
	srv := cutSuccessServer(t, &down, &executions)
	path := filepath.Join(t.TempDir(), "ops.db")
	policy := fastRetry()
	policy.MaxStatusChecks = 1
	ctx := context.Background()

	j1, err := idem.OpenSQLite(path)
	require.NoError(t, err)
	c1, err := idem.New(idem.Config{Journal: j1, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/idempotency"), Retry: policy})
	require.NoError(t, err)
	_, err = c1.Do(ctx, orderOp("op-1", 1))
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the status endpoint was down")
	require.NoError(t, c1.Close())
	require.NoError(t, j1.Close())

	// Another client (a restarted process) on the same file: its Send
	// meets the endpoint still down, and leaves the operation unknown.
	j2 := openJournal(t, path)
	c2, _ := newClient(t, idem.Config{Journal: j2, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/idempotency"), Retry: policy})
	op, err := c2.Begin(ctx, orderOp("op-1", 1))
	require.NoError(t, err)
	_, err = op.Send(ctx)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the status endpoint is still down")
	rec, err := c2.Lookup(ctx, "default", "op-1")
	require.NoError(t, err)
	require.Equal(t, idem.StateUnknown, rec.State)
	assert.Contains(t, rec.LastError, "HTTP 201", "the proof is kept by a write that did not see the answer")

	down.Store(false) // back, and the server lost the key
	for i := 0; i < 200; i++ {
		rep, err := c2.Resume(ctx)
		require.NoError(t, err)
		if rep.Claimed > 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	rec, err = c2.Lookup(ctx, "default", "op-1")
	require.NoError(t, err)
	assert.Equal(t, idem.StateExpired, rec.State, "parked: %s", rec.LastError)
	assert.Equal(t, int32(1), executions.Load(), "sent again after not_found: executed %d times", executions.Load())
	_, err = c2.Do(ctx, orderOp("op-1", 1))
	assert.ErrorIs(t, err, idem.ErrKeyNotHonoured)
}
