package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// review4CheckDue checks schema 7's promises after a write: every active
// operation (pending, in_flight, unknown) has exactly one row in due, at
// its next_attempt_at, and no settled one has any; and every operation's
// History is versions 1..Version, each once, in order.
func review4CheckDue(t *testing.T, ctx context.Context, pool *pgxpool.Pool, j *postgres.Journal, schema, step string) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT o.key, o.state, o.next_attempt_at, o.version,
		(SELECT count(*) FROM `+schema+`.due d WHERE d.id = o.id),
		(SELECT count(*) FROM `+schema+`.due d WHERE d.id = o.id AND d.next_attempt_at = o.next_attempt_at)
		FROM `+schema+`.operations o ORDER BY o.id`)
	require.NoError(t, err)
	type row struct {
		key              string
		state            int
		next, version    int64
		inDue, inDueAtIt int64
	}
	var all []row
	for rows.Next() {
		var r row
		require.NoError(t, rows.Scan(&r.key, &r.state, &r.next, &r.version, &r.inDue, &r.inDueAtIt))
		all = append(all, r)
	}
	require.NoError(t, rows.Err())
	var orphans int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.due d WHERE NOT EXISTS
		(SELECT 1 FROM `+schema+`.operations o WHERE o.id = d.id)`).Scan(&orphans))
	assert.Zero(t, orphans, "%s: rows of due with no operation", step)
	for _, r := range all {
		active := r.state >= 1 && r.state <= 3
		if active {
			assert.Equal(t, int64(1), r.inDue, "%s: active operation %s (state %d) in due %d times", step, r.key, r.state, r.inDue)
			assert.Equal(t, int64(1), r.inDueAtIt, "%s: active operation %s's due row is at its next_attempt_at", step, r.key)
		} else {
			assert.Zero(t, r.inDue, "%s: settled operation %s (state %d) in due", step, r.key, r.state)
		}
		h, err := j.History(ctx, r.key)
		require.NoError(t, err)
		vs := make([]int64, len(h))
		for i, ev := range h {
			vs[i] = ev.Version
		}
		want := make([]int64, r.version)
		for i := range want {
			want[i] = int64(i + 1)
		}
		assert.Equal(t, want, vs, "%s: history versions of %s (state %d)", step, r.key, r.state)
		assert.True(t, sort.SliceIsSorted(h, func(a, b int) bool { return h[a].Version < h[b].Version }))
	}
}

// A random walk over every journal write that changes an operation's state
// or due time (Create, Claim, leased Update with a new due time and state,
// Release, Acquire after the lease lapsed, unleased operator settles,
// Prune), checking schema 7's due table and the history after each step.
func TestReview4DueTableAndHistoryAfterEveryWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema))
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))

	var keys []string
	for range 6 {
		r := newRecord("review4")
		if rng.IntN(2) == 0 {
			r.State = idem.StateInFlight
			r.Attempts = 1
		}
		rec, created, err := j.Create(ctx, r)
		require.NoError(t, err)
		require.True(t, created)
		keys = append(keys, rec.Key)
	}
	review4CheckDue(t, ctx, pool, j, schema, "create")
	held := map[string]idem.Record{}
	owners := []string{"review4-a", "review4-b"}
	done := map[string]int{}
	defer func() { t.Logf("steps run: %v", done) }()
	for step := range 60 {
		key := keys[rng.IntN(len(keys))]
		owner := owners[rng.IntN(2)]
		var what string
		switch rng.IntN(7) {
		case 0:
			what = "claim"
			got, err := j.Claim(ctx, idem.ClaimRequest{Owner: owner, Limit: 2, Lease: 50 * time.Millisecond})
			require.NoError(t, err)
			for _, r := range got {
				held[r.Key] = r
			}
		case 1:
			what = "acquire"
			r, err := j.Acquire(ctx, key, owner, 50*time.Millisecond)
			if err == nil {
				held[r.Key] = r
			}
		case 2, 3:
			r, ok := held[key]
			if !ok {
				continue
			}
			what = "leased update"
			next := r
			switch rng.IntN(4) {
			case 0:
				next.State = idem.StateInFlight
				next.Attempts++
				next.NextAttemptAt = time.Now().Add(time.Duration(rng.IntN(3)) * 10 * time.Millisecond)
			case 1:
				next.State = idem.StateUnknown
				next.LastError = "timeout"
				next.NextAttemptAt = time.Now().Add(20 * time.Millisecond)
			case 2:
				next.State = idem.StateSucceeded
				next.Response = &idem.Response{StatusCode: 201}
			case 3:
				next.NextAttemptAt = time.Now().Add(time.Duration(rng.IntN(3)) * 15 * time.Millisecond)
			}
			if next.State == idem.StateInFlight && r.State == idem.StateUnknown {
				next.State = idem.StateUnknown
			}
			out, err := j.Update(ctx, next, idem.Durability(rng.IntN(2)), idem.Event{Detail: "review4"})
			if err == nil {
				done["update ok"]++
				held[key] = out
				if out.State.Terminal() {
					delete(held, key)
				}
			} else {
				delete(held, key)
			}
		case 4:
			r, ok := held[key]
			if !ok {
				continue
			}
			what = "release"
			_ = j.Release(ctx, key, r.Lease)
			delete(held, key)
			require.NoError(t, j.Sync(ctx))
		case 5:
			what = "operator settle"
			r, err := j.Get(ctx, key)
			require.NoError(t, err)
			next := r
			next.Lease = idem.Lease{}
			switch r.State {
			case idem.StatePending:
				next.State = idem.StateCanceled
				next.LastError = "canceled"
			case idem.StateUnknown:
				next.State = idem.StateSucceeded
				next.Note = "reconciled"
			default:
				continue
			}
			_, _ = j.Update(ctx, next, idem.Durable, idem.Event{Detail: "operator"})
		case 6:
			what = "prune"
			_, err := j.Prune(ctx, time.Now().Add(time.Hour))
			require.NoError(t, err)
			var live []string
			for _, k := range keys {
				if _, err := j.Get(ctx, k); err == nil {
					live = append(live, k)
				}
			}
			keys = live
			for range 6 - len(keys) {
				rec, _, err := j.Create(ctx, newRecord("review4"))
				require.NoError(t, err)
				keys = append(keys, rec.Key)
			}
		}
		done[what]++
		require.NoError(t, j.Sync(ctx))
		review4CheckDue(t, ctx, pool, j, schema, what)
		if t.Failed() {
			t.Fatalf("step %d (%s) broke the invariants; seed %d", step, what, seed)
		}
		time.Sleep(10 * time.Millisecond) // lets leases lapse, so Acquire and Claim take over
	}
}

// Each write that changes state or due time, with its COMMIT's reply lost
// (the journal reads the commit back): afterwards, due and History still
// hold schema 7's promises.
func TestReview4DueTableAfterLostCommitReplies(t *testing.T) {
	t.Parallel()
	writes := map[string]func(t *testing.T, j *postgres.Journal, rec idem.Record) error{
		"update-new-due-time": func(t *testing.T, j *postgres.Journal, rec idem.Record) error {
			next := rec
			next.State, next.Attempts = idem.StateUnknown, rec.Attempts+1
			next.NextAttemptAt = time.Now().Add(time.Hour)
			_, err := j.Update(ctx, next, idem.Durable, idem.Event{Detail: "review4"})
			return err
		},
		"update-deferred-new-due-time": func(t *testing.T, j *postgres.Journal, rec idem.Record) error {
			next := rec
			next.NextAttemptAt = time.Now().Add(time.Hour)
			_, err := j.Update(ctx, next, idem.Deferred, idem.Event{Detail: "review4"})
			if err == nil {
				err = j.Sync(ctx)
			}
			return err
		},
		"settle": func(t *testing.T, j *postgres.Journal, rec idem.Record) error {
			next := rec
			next.State = idem.StateSucceeded
			next.Response = &idem.Response{StatusCode: 201}
			_, err := j.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventAnswer})
			return err
		},
		"release": func(t *testing.T, j *postgres.Journal, rec idem.Record) error {
			// readBack's doc: a release whose commit is in doubt runs again
			// and, having committed, fails with ErrLeaseLost.
			if err := j.Release(ctx, rec.Key, rec.Lease); err != nil && !errors.Is(err, idem.ErrLeaseLost) {
				return err
			}
			if err := j.Sync(ctx); err != nil && !errors.Is(err, idem.ErrLeaseLost) {
				return err
			}
			return nil
		},
		"acquire-after-lapse": func(t *testing.T, j *postgres.Journal, rec idem.Record) error {
			time.Sleep(60 * time.Millisecond)
			_, err := j.Acquire(ctx, rec.Key, "review4-b", time.Minute)
			return err
		},
		"claim-after-lapse": func(t *testing.T, j *postgres.Journal, rec idem.Record) error {
			time.Sleep(60 * time.Millisecond)
			_, err := j.Claim(ctx, idem.ClaimRequest{Owner: "review4-b", Lease: time.Minute, Limit: 5})
			return err
		},
	}
	for name, write := range writes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, pool := proxiedPool(t)
			schema := pgtest.Schema(t)
			j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema))
			require.NoError(t, err)
			t.Cleanup(func() { _ = j.Close() })
			direct := pgtest.Pool(t)
			dj, err := postgres.OpenJournal(ctx, direct, postgres.Schema(schema))
			require.NoError(t, err)
			t.Cleanup(func() { _ = dj.Close() })
			r := newRecord("review4")
			r.State, r.Attempts = idem.StateInFlight, 1
			r.Lease = idem.Lease{Owner: "review4-a", ExpiresAt: time.Now().Add(50 * time.Millisecond)}
			rec, _, err := j.Create(ctx, r)
			require.NoError(t, err)
			f := p.DropReply(commitsWrite)
			err = write(t, j, rec)
			fired(t, f)
			require.NoError(t, err)
			review4CheckDue(t, ctx, direct, dj, schema, name)
		})
	}
}

// Writes of one operation that meet in one batch (a deferred update that
// moves its due time, then its release, then a claim, sent back to back
// without waiting): each finds its due row by the time it was due at,
// which the write before it in the batch changed.
func TestReview4DueTableWhenOneOperationsWritesShareABatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema))
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	for round := range 10 {
		r := newRecord("review4")
		r.State, r.Attempts = idem.StateInFlight, 1
		r.Lease = idem.Lease{Owner: "review4-a", ExpiresAt: time.Now().Add(time.Minute)}
		rec, _, err := j.Create(ctx, r)
		require.NoError(t, err)
		next := rec
		next.State = idem.StateUnknown
		next.LastError = "timeout"
		next.NextAttemptAt = time.Now().Add(-time.Duration(round+1) * time.Second)
		out, err := j.Update(ctx, next, idem.Deferred, idem.Event{Detail: "review4"})
		require.NoError(t, err)
		next2 := out
		next2.NextAttemptAt = time.Now().Add(-time.Duration(round+5) * time.Second)
		out2, err := j.Update(ctx, next2, idem.Deferred, idem.Event{Detail: "review4 again"})
		require.NoError(t, err)
		require.NoError(t, j.Release(ctx, out2.Key, out2.Lease))
		got, err := j.Claim(ctx, idem.ClaimRequest{Owner: "review4-b", Lease: time.Minute, Limit: 1})
		require.NoError(t, err)
		if len(got) == 1 {
			settled := got[0]
			settled.State = idem.StateSucceeded
			settled.Response = &idem.Response{StatusCode: 201}
			_, err = j.Update(ctx, settled, idem.Deferred, idem.Event{Kind: idem.EventAnswer})
			require.NoError(t, err)
		}
		require.NoError(t, j.Sync(ctx))
		review4CheckDue(t, ctx, pool, j, schema, fmt.Sprintf("round %d", round))
	}
}
