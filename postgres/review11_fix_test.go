package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// A write still queued whose caller's context ends leaves with the
// context's error, and is never sent. Both batches that may run at once
// (maxRunning) are blocked on row locks other sessions hold, so nothing
// takes the write: before the fix, Update waited for them, whatever its
// context (the test gives it 5 s), and its row must be as it was once
// everything queued has run and the locks are released.
func TestQueuedWriteWhoseContextEndsIsNeverSent(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	j, err := postgres.OpenJournal(ctx, pgtest.Pool(t), postgres.Schema(schema))
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	recs := review11Created(t, j, 3)
	b := recs[2]

	var dones []chan struct{}
	var holders []pgx.Tx
	for _, a := range recs[:2] {
		holder := review11HoldRow(t, schema, a.Key)
		done := make(chan struct{})
		dones = append(dones, done)
		go func() {
			defer close(done)
			next := a
			next.State = idem.StateSucceeded
			next.Response = &idem.Response{StatusCode: 201}
			_, werr := j.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventAnswer})
			assert.NoError(t, werr)
		}()
		// The second is taken by a second batch once the first is stuck
		// (see watchBatches).
		review11WaitForLockWait(t, holder, done)
		holders = append(holders, holder)
	}

	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	bDone := make(chan struct{})
	var berr error
	go func() {
		defer close(bDone)
		nb := b
		nb.State = idem.StateSucceeded
		nb.Response = &idem.Response{StatusCode: 202}
		_, berr = j.Update(cctx, nb, idem.Durable, idem.Event{Kind: idem.EventAnswer})
	}()
	select {
	case <-bDone:
	case <-time.After(5 * time.Second):
		t.Fatal("the caller's context ended and Update has not returned: it waits for batches blocked on row locks")
	}
	for _, h := range holders {
		require.NoError(t, h.Rollback(ctx))
	}
	for _, d := range dones {
		<-d
	}
	<-bDone
	require.ErrorIs(t, berr, context.DeadlineExceeded)
	assert.Equal(t, context.DeadlineExceeded.Error(), berr.Error(), "a write never sent answers with its context's error alone")
	// Anything still queued has run once a later write by the journal has.
	review11Created(t, j, 1)
	got, err := j.Get(ctx, b.Key)
	require.NoError(t, err)
	assert.Equal(t, b.Version, got.Version, "a write whose caller left while it was queued was sent")
}
