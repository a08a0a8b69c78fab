package postgres

import (
	"sync/atomic"
	"testing"
	"time"
)

// Batches that begin within batchRenew of each other share one bound, which
// leaves each of them at least batchTimeout; stopping it ends its context.
func TestBatchContextShared(t *testing.T) {
	var cur atomic.Pointer[batchBound]
	before := time.Now()
	a := batchContext(&cur)
	b := batchContext(&cur)
	if a != b {
		t.Fatal("two batches begun at once got two bounds: a timer per batch")
	}
	d, ok := a.Deadline()
	if !ok {
		t.Fatal("a batch's context has no deadline")
	}
	if left := d.Sub(before); left < batchTimeout || left > batchTimeout+batchRenew+time.Second {
		t.Fatalf("a batch begun now is bounded %v from now, want %v to %v", left, batchTimeout, batchTimeout+batchRenew)
	}
	// Past its renewal, a bound leaves a later batch less than batchTimeout:
	// that batch gets a new one.
	cur.Load().until = time.Now().Add(-time.Millisecond)
	c := batchContext(&cur)
	if c == a {
		t.Fatal("a batch begun after the bound's renewal got the old bound")
	}
	if d, _ := c.Deadline(); time.Until(d) < batchTimeout {
		t.Fatalf("the new bound leaves %v, want at least %v", time.Until(d), batchTimeout)
	}
	stopBatchBound(&cur)
	if c.Err() == nil {
		t.Fatal("the bound's context runs on after it was stopped")
	}
	if cur.Load() != nil {
		t.Fatal("a stopped bound is still shared")
	}
	if e := batchContext(&cur); e.Err() != nil {
		t.Fatal("a batch after a stop got an ended context")
	}
	stopBatchBound(&cur)
}

// The rule that ends a store.s batch: at the
// latest of its callers' deadlines when all have one within the bound;
// at the bound otherwise.
func TestBatchDeadline(t *testing.T) {
	id := func(d time.Time) time.Time { return d }
	soon, later := time.Now().Add(time.Second), time.Now().Add(2*time.Second)
	if end, ok := batchDeadline([]time.Time{soon, later, soon}, id, batchTimeout); !ok || !end.Equal(later) {
		t.Fatalf("callers with deadlines: %v %v, want the latest, %v", end, ok, later)
	}
	if _, ok := batchDeadline([]time.Time{soon, {}}, id, batchTimeout); ok {
		t.Fatal("a caller without a deadline: the batch must run to its bound")
	}
	if _, ok := batchDeadline([]time.Time{soon, time.Now().Add(2 * batchTimeout)}, id, batchTimeout); ok {
		t.Fatal("a caller's deadline past the bound: the batch must run to its bound")
	}
	if _, ok := batchDeadline([]time.Time(nil), id, batchTimeout); ok {
		t.Fatal("no callers: the bound")
	}
}

// The rule that ends a journal's batch: at the soonest of its callers'
// deadlines, whether or not every caller has one; at the bound when none
// has one within it.
func TestFirstDeadline(t *testing.T) {
	id := func(d time.Time) time.Time { return d }
	soon, later := time.Now().Add(time.Second), time.Now().Add(2*time.Second)
	if end, ok := firstDeadline([]time.Time{later, soon, {}}, id, batchTimeout); !ok || !end.Equal(soon) {
		t.Fatalf("callers with and without deadlines: %v %v, want the soonest, %v", end, ok, soon)
	}
	if _, ok := firstDeadline([]time.Time{{}, {}}, id, batchTimeout); ok {
		t.Fatal("no caller with a deadline: the batch must run to its bound, with no timer of its own")
	}
	if _, ok := firstDeadline([]time.Time{{}, time.Now().Add(2 * batchTimeout)}, id, batchTimeout); ok {
		t.Fatal("a caller's deadline past the bound: the batch must run to its bound")
	}
}
