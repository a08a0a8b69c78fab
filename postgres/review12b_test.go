package postgres_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// Hole: a caller WITHOUT a deadline has its create fail because another
// caller, in the same batch, had a short one. What the user sees, after
// about 30 s (readBackTimeout): "postgres journal in schema ...: the create
// of operation ...: commit sent, acknowledgement lost (timeout: context
// already done: context deadline exceeded), and reading it back failed:
// the session that ran it (server process N) still runs it: context
// deadline exceeded; it may or may not be committed".
// Why it is wrong: the batch, cut at its batchmate's deadline (tryBatch,
// firstDeadline), fails its second round trip with pgconn's "context
// already done": nothing was sent, the connection is still open (rolled
// back by readBatch's deferred ROLLBACK) and goes back to the pool. doubtful
// does not look at that (SafeToRetry) and makes it a commit in doubt of
// that live session (pid + its own client port), and settle then waits
// for that pooled session to be idle: its own pg_stat_activity query,
// given that very connection by the pool, sees it "active" (while the test
// was stuck in settle, no session of its schema was anything but idle), so
// it polls until its 30 s are gone; had it caught the session "idle in
// transaction" inside another batch, it would have terminated it
// (pg_terminate_backend; not seen in these runs). The write was never sent: it
// should run again alone and succeed, as the brief's rule 1 says.
func TestReview12bCallerWithoutADeadlineIsNotFailedByABatchmatesShortDeadline(t *testing.T) {
	j, err := postgres.OpenJournal(ctx, pgtest.Pool(t), postgres.Schema(pgtest.Schema(t)))
	require.NoError(t, err)
	defer j.Close()
	stop := time.Now().Add(4 * time.Second)
	var failed atomic.Value
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for time.Now().Before(stop) && failed.Load() == nil {
				if _, _, err := j.Create(ctx, newRecord("shop")); err != nil {
					failed.CompareAndSwap(nil, err)
				}
			}
		})
	}
	for i := range 4 {
		wg.Go(func() {
			for n := 0; time.Now().Before(stop) && failed.Load() == nil; n++ {
				c, cancel := context.WithTimeout(ctx, time.Duration(1+(i+n)%5)*time.Millisecond)
				_, _, _ = j.Create(c, newRecord("shop"))
				cancel()
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatalf("a create on a context without a deadline failed because a batchmate had a short one: %v", err)
	}
}

// Hole: a lone caller whose short deadline ends between the two round trips
// of its write (readBatch: the read-and-lock, then the changes and the
// commit) is held for 30 s, not until its deadline, and is told its commit
// is in doubt though nothing of the commit was ever sent. What the user
// sees (an Update on a 500 µs context): after 30.0 s, "...: the update of
// operation ... to succeeded, version 2: commit sent, acknowledgement lost
// (timeout: context already done: context deadline exceeded), and reading
// it back failed: the session that ran it (server process N) still runs
// it: context deadline exceeded" — errors.Is(err, postgres.ErrCommitInDoubt)
// true, errors.Is(err, context.DeadlineExceeded) false. Why it is wrong:
// pgconn refused to send the second round trip (its context was already
// done), the connection stayed open and went back to the pool, and settle,
// looking for that live session by pid and port, is given that very
// connection by the pool and sees itself "active" until readBackTimeout.
// Expected: the caller's deadline error, at about its deadline (the test
// gives it 5 s), and nothing "in doubt".
func TestReview12bLoneCallerWhoseDeadlineEndsBetweenRoundTripsIsNotHeld30sAsInDoubt(t *testing.T) {
	schema := pgtest.Schema(t)
	j1, err := postgres.OpenJournal(ctx, pgtest.Pool(t), postgres.Schema(schema))
	require.NoError(t, err)
	defer j1.Close()
	for i := range 300 {
		rec := newRecord("shop")
		rec.State, rec.Attempts = idem.StateInFlight, 1
		rec, _, err = j1.Create(ctx, rec)
		require.NoError(t, err)
		// A journal with no copy of the row: the Update reads and locks
		// it first (readBatch, two round trips).
		j2, err := postgres.OpenJournal(ctx, pgtest.Pool(t), postgres.Schema(schema))
		require.NoError(t, err)
		d := time.Duration(200+(i%30)*100) * time.Microsecond
		c, cancel := context.WithTimeout(ctx, d)
		start := time.Now()
		_, err = j2.Update(c, review12Answer(rec), idem.Durable, idem.Event{Kind: idem.EventAnswer})
		took := time.Since(start)
		cancel()
		_ = j2.Close()
		require.Falsef(t, errors.Is(err, postgres.ErrCommitInDoubt),
			"try %d: an Update on a %v context, never sent past its read, reported in doubt after %v: %v", i, d, took, err)
		require.Lessf(t, took, 5*time.Second, "try %d: an Update on a %v context returned after %v: %v", i, d, took, err)
	}
}
