package postgres_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
)

// TestHistoryWhileTheRowMovesOn: History reads the events written, the
// creation event the row keeps (cr_ columns, schema 8) and the event the
// row holds (ev_ columns) in one statement. While an operation created
// without a read is moved on as fast as two journals can (writes without
// a read, which keep the creation event in the row and move the held one
// into events; claims and updates after a read, which write them into
// events), readers on both journals must see, every time, each version's
// event once, versions 1 to the latest without a gap, the first the
// creation.
func TestHistoryWhileTheRowMovesOn(t *testing.T) {
	t.Parallel()
	_, ja, jb := proxiedJournal(t)
	rec := newRecord("shop")
	rec.State, rec.Attempts = idem.StateInFlight, 1
	rec.Lease = idem.Lease{Owner: "a", ExpiresAt: time.Now().Add(time.Minute)}
	cur, _, err := ja.Create(ctx, rec)
	require.NoError(t, err)

	var stop atomic.Bool
	var reads atomic.Int64
	var wg sync.WaitGroup
	bad := make(chan string, 8)
	for _, j := range []*postgres.Journal{ja, jb} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				h, err := j.History(ctx, rec.Key)
				if err != nil {
					bad <- err.Error()
					return
				}
				reads.Add(1)
				for i, ev := range h {
					if ev.Version != int64(i+1) || (i == 0) != (ev.Kind == idem.EventCreate) {
						vs := make([]string, len(h))
						for k, e := range h {
							vs[k] = fmt.Sprintf("v%d:%s", e.Version, e.Kind)
						}
						bad <- fmt.Sprint(vs)
						return
					}
				}
			}
		}()
	}

	// move moves the record on n times with writes without a read, then
	// lets it go: the other journal claims it (after a read).
	move := func(j *postgres.Journal, n int) {
		for range n {
			next := cur
			next.Attempts++
			cur, err = j.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventSend})
			require.NoError(t, err)
		}
		require.NoError(t, j.Release(ctx, cur.Key, cur.Lease))
	}
	for round := range 6 {
		j, owner := ja, "a"
		if round%2 == 1 {
			j, owner = jb, "b"
		}
		if round > 0 {
			cur, err = j.Acquire(ctx, rec.Key, owner, time.Minute)
			require.NoError(t, err)
		}
		move(j, 1+round)
	}
	for reads.Load() < 10 {
		select {
		case b := <-bad:
			t.Fatal(b)
		case <-time.After(time.Millisecond):
		}
	}
	stop.Store(true)
	wg.Wait()
	close(bad)
	for b := range bad {
		t.Error("a history with an event lost, duplicated or out of order:", b)
	}
	h, err := jb.History(ctx, rec.Key)
	require.NoError(t, err)
	assert.Len(t, h, int(cur.Version), "each version's event once")
}
