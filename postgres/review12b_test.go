package postgres_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
