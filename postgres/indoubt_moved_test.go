package postgres_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestCreateInDoubtWhoseRowMovedOnIsThisCallsCreate: a create written
// without a read (one statement, committed at its Sync) whose
// acknowledgement is lost, and whose row another process moves past
// version 1 (a claim, then an update) before the read-back looks: the
// read-back must still find the create (its creation event is no longer
// in the row's ev_ columns, nor in cr_, but in events), so Create reports
// it as this call's, once; History holds each version once, in order.
// The read-back is held back by the proxy (every server message is
// delayed) until the other process has moved the row.
func TestCreateInDoubtWhoseRowMovedOnIsThisCallsCreate(t *testing.T) {
	t.Parallel()
	// One session, on which a create has run just now: the create in doubt
	// needs no statement prepared, nor a ping, whose answer the delay
	// would hold.
	p, j, direct := proxiedJournalOf(t, 1)
	_, _, err := j.Create(ctx, newRecord("shop"))
	require.NoError(t, err)
	rec := newRecord("shop")

	f := p.DropReply(commitsWrite)
	p.Delay(time.Hour)
	type result struct {
		rec     idem.Record
		created bool
		err     error
	}
	done := make(chan result, 1)
	go func() {
		got, created, err := j.Create(ctx, rec)
		done <- result{got, created, err}
	}()
	select {
	case <-f.Done():
	case r := <-done:
		p.Delay(0)
		t.Fatalf("the create ended before its reply was dropped: %+v", r)
	}

	// The row is committed; its creator waits on its read-back.
	claimed, err := direct.Acquire(ctx, rec.Key, "w2", time.Minute)
	require.NoError(t, err)
	next := claimed
	next.State, next.Attempts = idem.StateInFlight, 1
	moved, err := direct.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventSend})
	require.NoError(t, err)
	require.Greater(t, moved.Version, int64(2))
	p.Delay(0)

	r := <-done
	require.NoError(t, r.err, "the create committed: the read-back must find it")
	assert.True(t, r.created, "the create committed: it is this call's")
	assert.Equal(t, int64(1), r.rec.Version)

	hist, err := direct.History(ctx, rec.Key)
	require.NoError(t, err)
	var versions []int64
	for _, ev := range hist {
		versions = append(versions, ev.Version)
	}
	assert.Equal(t, []int64{1, 2, 3}, versions, "each version's event once, in order")
	if assert.NotEmpty(t, hist) {
		assert.Equal(t, idem.EventCreate, hist[0].Kind)
	}
}
