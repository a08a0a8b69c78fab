package journaltest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/journal"
)

// The concurrency subtests release their goroutines together from a closed
// channel and wait for them with a WaitGroup; nothing sleeps to order them.

func testConcurrentCreate(t *testing.T, j idem.Journal) {
	const n = 100
	base := newRecord("tenant-race")
	type result struct {
		proposed string
		rec      idem.Record
		created  bool
		err      error
	}
	results := make([]result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range results {
		rec := journal.CloneRecord(base)
		rec.Key = uuid.NewString()
		results[i].proposed = rec.Key
		wg.Go(func() {
			<-start
			results[i].rec, results[i].created, results[i].err = j.Create(t.Context(), rec)
		})
	}
	close(start)
	wg.Wait()

	winner := -1
	for i, r := range results {
		require.NoError(t, r.err, "Create %d", i)
		if r.created {
			require.Equal(t, -1, winner, "Create %d and %d both created the record", winner, i)
			winner = i
		}
	}
	require.NotEqual(t, -1, winner, "no Create created the record")
	key := results[winner].proposed
	assert.Equal(t, key, results[winner].rec.Key, "the winner's key is the one it proposed")
	for i, r := range results {
		assert.Equal(t, key, r.rec.Key, "Create %d returned another key", i)
		assert.Equal(t, int64(1), r.rec.Version, "Create %d", i)
	}
	assert.Equal(t, []string{key}, listKeys(t, j, idem.Filter{}), "one record")
	got, err := j.Lookup(t.Context(), base.Scope, base.ID)
	require.NoError(t, err)
	assert.Equal(t, key, got.Key)
	assert.Len(t, history(t, j, key), 1, "one creation event")
}

func testConcurrentUpdate(t *testing.T, j idem.Journal) {
	const racers, rounds = 8, 20
	cur := create(t, j, newRecord("tenant-a"))
	for round := range rounds {
		type result struct {
			rec idem.Record
			err error
		}
		results := make([]result, racers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range results {
			next := journal.CloneRecord(cur)
			next.State = idem.StateInFlight
			next.Attempts = cur.Attempts + 1
			next.LastError = fmt.Sprintf("racer %d, round %d", i, round)
			d := []idem.Durability{idem.Durable, idem.Deferred, idem.Buffered}[i%3]
			wg.Go(func() {
				<-start
				results[i].rec, results[i].err = j.Update(t.Context(), next, d, idem.Event{})
			})
		}
		close(start)
		wg.Wait()

		winner := -1
		for i, r := range results {
			if r.err == nil {
				require.Equal(t, -1, winner, "round %d: racers %d and %d both won", round, winner, i)
				winner = i
				continue
			}
			require.ErrorIs(t, r.err, idem.ErrConflict, "round %d: racer %d", round, i)
		}
		require.NotEqual(t, -1, winner, "round %d: nobody won", round)
		won := results[winner].rec
		assert.Equal(t, cur.Version+1, won.Version, "round %d", round)
		assert.Equal(t, fmt.Sprintf("racer %d, round %d", winner, round), won.LastError, "round %d", round)
		requireStored(t, j, won)
		cur = won
	}
	assert.Equal(t, int64(1+rounds), cur.Version)
	assert.Equal(t, rounds, cur.Attempts)
	assert.Len(t, history(t, j, cur.Key), 1+rounds, "one event per winning update")
}

func testConcurrentAcquire(t *testing.T, j idem.Journal) {
	const racers = 20
	rec := create(t, j, newRecord("tenant-a"))
	type result struct {
		rec idem.Record
		err error
	}
	results := make([]result, racers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			<-start
			results[i].rec, results[i].err = j.Acquire(t.Context(), rec.Key, fmt.Sprintf("worker-%d", i), longLease)
		})
	}
	close(start)
	wg.Wait()

	winner := -1
	for i, r := range results {
		if r.err == nil {
			require.Equal(t, -1, winner, "workers %d and %d both acquired the record", winner, i)
			winner = i
			continue
		}
		require.ErrorIs(t, r.err, idem.ErrLeased, "worker %d", i)
	}
	require.NotEqual(t, -1, winner, "nobody acquired the record")
	got := get(t, j, rec.Key)
	assert.Equal(t, fmt.Sprintf("worker-%d", winner), got.Lease.Owner)
	assert.Equal(t, int64(1), got.Lease.Epoch)
	assert.Equal(t, rec.Version+1, got.Version, "one Acquire took effect")
}

func testConcurrentClaim(t *testing.T, j idem.Journal) {
	const records, creators = 200, 8
	want := make(map[string]bool, records)
	keys := make([][]string, creators)
	errs := make([]error, creators)
	var wg sync.WaitGroup
	for c := range creators {
		wg.Go(func() {
			for i := c; i < records; i += creators {
				rec := newRecord("tenant-a")
				rec.NextAttemptAt = time.Now().Add(-time.Duration(i) * time.Millisecond)
				if _, _, err := j.Create(t.Context(), rec); err != nil {
					errs[c] = err
					return
				}
				keys[c] = append(keys[c], rec.Key)
			}
		})
	}
	wg.Wait()
	for c := range creators {
		require.NoError(t, errs[c])
		for _, k := range keys[c] {
			want[k] = true
		}
	}
	require.Len(t, want, records)

	owners := []string{"worker-1", "worker-2"}
	claimed := make([][]idem.Record, len(owners))
	claimErrs := make([]error, len(owners))
	start := make(chan struct{})
	for o, owner := range owners {
		wg.Go(func() {
			<-start
			for {
				recs, err := j.Claim(t.Context(), idem.ClaimRequest{Owner: owner, Limit: 7, Lease: longLease})
				if err != nil {
					claimErrs[o] = err
					return
				}
				if len(recs) == 0 {
					return // nothing becomes claimable again while the leases are live
				}
				claimed[o] = append(claimed[o], recs...)
			}
		})
	}
	close(start)
	wg.Wait()

	owner := map[string]string{}
	for o, recs := range claimed {
		require.NoError(t, claimErrs[o], "Claim by %s", owners[o])
		for _, r := range recs {
			if prev, dup := owner[r.Key]; dup {
				t.Errorf("%s was claimed by %s and by %s", r.Key, prev, owners[o])
			}
			owner[r.Key] = owners[o]
			assert.True(t, want[r.Key], "claimed unknown key %s", r.Key)
			assert.Equal(t, owners[o], r.Lease.Owner)
			assert.Equal(t, int64(1), r.Lease.Epoch)
		}
	}
	assert.Len(t, owner, records, "every due record was claimed")
	for key := range want {
		assert.Equal(t, owner[key], get(t, j, key).Lease.Owner, "stored owner of %s", key)
	}
}

func testConcurrentFence(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	rec := create(t, j, newRecord("tenant-a"))
	a := acquire(t, j, rec.Key, "worker-A", shortLease)

	var (
		aVersions []int64 // versions of worker-A's successful writes
		aErr      error
		b         idem.Record
		bErr      error
		wg        sync.WaitGroup
	)
	stop, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	// worker-A keeps writing under its lease, re-reading the record each
	// time, until it is fenced out.
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			cur, err := j.Get(ctx, rec.Key)
			if err != nil {
				aErr = err
				return
			}
			cur.Lease = a.Lease
			cur.State = idem.StateInFlight
			cur.Attempts++
			cur.LastError = "worker-A"
			got, err := j.Update(ctx, cur, idem.Durability(len(aVersions)%2), idem.Event{})
			switch {
			case err == nil:
				aVersions = append(aVersions, got.Version)
			case errors.Is(err, idem.ErrLeaseLost):
				return
			case errors.Is(err, idem.ErrConflict):
				// worker-B's claim landed between the read and the write.
			default:
				aErr = err
				return
			}
			select {
			case <-stop.Done():
				aErr = fmt.Errorf("worker-A was never fenced out: %w", stop.Err())
				return
			case <-tick.C:
			}
		}
	})
	// worker-B claims the record as soon as worker-A's lease runs out.
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			recs, err := j.Claim(ctx, idem.ClaimRequest{Owner: "worker-B", Limit: 1, Lease: longLease})
			if err != nil {
				bErr = err
				return
			}
			if len(recs) == 1 {
				b = recs[0]
				return
			}
			select {
			case <-stop.Done():
				bErr = fmt.Errorf("worker-B never claimed the record: %w", stop.Err())
				return
			case <-tick.C:
			}
		}
	})
	wg.Wait()
	require.NoError(t, aErr)
	require.NoError(t, bErr)

	require.Equal(t, rec.Key, b.Key)
	require.Equal(t, "worker-B", b.Lease.Owner)
	require.Equal(t, a.Lease.Epoch+1, b.Lease.Epoch)
	for _, v := range aVersions {
		assert.Less(t, v, b.Version, "worker-A wrote version %d after worker-B claimed version %d", v, b.Version)
	}

	// Fenced for good: the re-read record with worker-A's lease is refused.
	cur := get(t, j, rec.Key)
	assertLease(t, b.Lease, cur.Lease, "Lease after the takeover")
	cur.Lease = a.Lease
	cur.State = idem.StateSucceeded
	_, err := j.Update(ctx, cur, idem.Durable, idem.Event{})
	require.ErrorIs(t, err, idem.ErrLeaseLost)

	next := journal.CloneRecord(b)
	next.State = idem.StateSucceeded
	next.Attempts = cur.Attempts
	done := update(t, j, next, idem.Durable)
	assert.Equal(t, "", done.Lease.Owner)

	evs := history(t, j, rec.Key)
	require.Len(t, evs, 4+len(aVersions), "creation, worker-A's lease and writes, worker-B's takeover and write")
	for _, ev := range evs {
		if ev.Owner == "worker-A" {
			assert.Less(t, ev.Version, b.Version, "an event of worker-A after the takeover")
		}
	}
	assert.Equal(t, "worker-B", evs[len(evs)-1].Owner)
}
