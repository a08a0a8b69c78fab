package postgres

import (
	"context"
	"sync/atomic"
	"time"
)

// batchTimeout bounds one batch's transaction; batchRenew is how long one
// bound serves the batches that begin under it. The batch runs on a
// context of its own: one caller giving up must not fail the others'
// writes. Batches share it: a context.WithTimeout of its own per batch
// made a timer per write, and adding a timer wakes a thread to watch it
// (the network poller, or an idle one started for it) which, at one
// caller, went back to sleep having found nothing to do: a share of each
// write's CPU. A batch's transaction is therefore bounded by between
// batchTimeout and batchTimeout+batchRenew, and the journal makes one
// timer per batchRenew while it writes.
const (
	batchTimeout = 30 * time.Second
	batchRenew   = 10 * time.Second
)

// batchBound is a bound batches share: its context, and when batches that
// begin stop taking it.
type batchBound struct {
	ctx    context.Context
	cancel context.CancelFunc
	until  time.Time
}

// batchContext returns the context a batch that begins now runs on: one
// that ends batchTimeout from now or somewhat later. A bound past its
// batchRenew is left to its own timer, which ends it while no batch can
// still use it within batchTimeout; two writers that renew at once make
// two, and one of them serves.
func batchContext(cur *atomic.Pointer[batchBound]) context.Context {
	now := time.Now()
	if b := cur.Load(); b != nil && now.Before(b.until) {
		return b.ctx
	}
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout+batchRenew)
	b := &batchBound{ctx: ctx, cancel: cancel, until: now.Add(batchRenew)}
	cur.Store(b)
	return ctx
}

// stopBatchBound ends the timer of the bound now shared, once no batch
// can begin or run under it.
func stopBatchBound(cur *atomic.Pointer[batchBound]) {
	if b := cur.Swap(nil); b != nil {
		b.cancel()
	}
}

// firstDeadline returns the soonest of callers' deadlines (a zero one is
// none), and false when none has one sooner than timeout from now, which
// the shared bound serves: at most one timer per batch, and none when no
// caller has a deadline.
func firstDeadline[T any](callers []T, deadline func(T) time.Time, timeout time.Duration) (end time.Time, ok bool) {
	for _, c := range callers {
		if d := deadline(c); !d.IsZero() && (end.IsZero() || d.Before(end)) {
			end = d
		}
	}
	if end.IsZero() || !end.Before(time.Now().Add(timeout)) {
		return time.Time{}, false
	}
	return end, true
}
