package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// A batch whose transaction waits on the server past the watch's limit
// (here a row another session holds locked, as a server that stopped
// answering would hold it) is canceled, and its writer gets an error
// instead of waiting for ever; the row is left as it was. Close ends the
// watch's goroutine (TestMain finds none left).
func TestBatchRunningPastItsLimitIsCanceled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	j, err := OpenJournal(ctx, pool, Schema(schema))
	require.NoError(t, err)
	defer j.Close()
	j.batches = newBatchWatch(300*time.Millisecond, 50*time.Millisecond)

	rec, created, err := j.Create(ctx, idem.Record{Key: "k1", Scope: "s", ID: "op1", Method: "POST", URL: "http://127.0.0.1:9/y",
		Fingerprint: strings.Repeat("ab", 32), KeyHeader: "Idempotency-Key", State: idem.StatePending})
	require.NoError(t, err)
	require.True(t, created)

	locker, err := pgx.Connect(ctx, pgtest.DSN())
	require.NoError(t, err)
	defer locker.Close(context.Background())
	tx, err := locker.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.Background())
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+j.q.operations+` WHERE key = $1 FOR UPDATE`, "k1")
	require.NoError(t, err)

	next := rec
	next.State, next.Attempts = idem.StateSucceeded, 1
	next.Response = &idem.Response{StatusCode: 201, Body: []byte("{}")}
	done := make(chan error, 1)
	go func() {
		_, err := j.Update(ctx, next, idem.Deferred, idem.Event{})
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(time.Minute): // far past the limit: the watch did not cut the batch
		require.NoError(t, tx.Rollback(ctx))
		t.Fatalf("the write waited on the locked row past its limit: %v", <-done)
	}
	require.Error(t, err, "the write was cut off")
	assert.True(t, errors.Is(err, context.Canceled), "the batch's context was canceled: %v", err)

	require.NoError(t, tx.Rollback(ctx))
	got, err := j.Get(ctx, "k1")
	require.NoError(t, err)
	assert.Equal(t, rec.Version, got.Version, "nothing was written")
	assert.Equal(t, idem.StatePending, got.State)
}

// The watch cancels a batch only once it has run past its limit, and its
// goroutine, started by the first batch, ends once none runs, or at stop.
func TestBatchWatchCancelsOnlyPastTheLimit(t *testing.T) {
	t.Parallel()
	w := newBatchWatch(time.Hour, time.Millisecond)
	ctx, end := w.begin()
	time.Sleep(20 * time.Millisecond) // many ticks
	assert.NoError(t, ctx.Err(), "a batch within its limit runs on")
	end()
	assert.Error(t, ctx.Err(), "an ended batch's context is released")
	w.stop()

	w = newBatchWatch(0, time.Millisecond)
	ctx, end = w.begin()
	defer end()
	<-ctx.Done() // a batch past its limit is canceled at the next tick
	w.stop()
}
