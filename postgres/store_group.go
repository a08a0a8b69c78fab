package postgres

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// storeGroup runs the writes of one kind that arrive together as one
// statement and one commit: the group commit of the SQLite store, for a
// database where every commit is a round trip, a transaction and a WAL
// flush. No goroutine of its own does the work: the first caller to find
// the group idle leads, runs one batch (its own write and whatever queued
// up to max), then hands the lead to the first caller still queued, so
// that no caller waits for more than the batch running when it arrived
// and its own.
//
// A caller whose context ends while its write is still queued takes it
// back, and it is never sent, even when it is handed the lead as its
// context ends (it hands the lead on); once its write is in a running
// batch, it waits for that batch's outcome, which is then its own.
type storeGroup[T any] struct {
	max int
	// run runs one batch and records each write's outcome in it. ctx
	// belongs to no caller: the batch is every caller's.
	run func(ctx context.Context, batch []*T)

	mu      sync.Mutex
	queue   []*storeWaiter[T]
	running bool
}

type storeWaiter[T any] struct {
	w *T
	// wake receives once: the write's outcome is in, or this caller
	// leads now.
	wake  chan struct{}
	taken bool // in a batch (guarded by the group's mu)
	leads bool // handed the lead (guarded by the group's mu)
	// lost is set when the batch's run panicked: the write's outcome is
	// unknown.
	lost bool
	// deadline is the caller's context's, zero if it has none.
	deadline time.Time
}

// errStoreBatchLost is the outcome of the writes of a batch whose run
// panicked in another caller's goroutine.
var errStoreBatchLost = errors.New("the batch this write was in failed in another request; its outcome is unknown, retry it")

// storeBatchTimeout bounds one batch: a statement the server never answers
// fails every write in it instead of holding their callers forever. A
// batch whose callers all have deadlines ends at the latest of them, if
// sooner: a caller that bounds its write (the server middleware bounds a
// Complete, so that a silent session cannot keep its lock from being
// renewed) is not held for 30 s, and no caller's write is cut before its
// own deadline.
const storeBatchTimeout = 30 * time.Second

// batchDeadline is the rule that ends a batch whose callers all bound
// their calls: at the latest of their deadlines (deadline gives each
// caller's, zero if it has none), when that comes within timeout, the
// batch's bound; ok is false, and no deadline is read of the clock, when a
// caller has none or the latest comes later: the batch then ends at its
// bound. A caller's write is never cut before its own deadline, and a
// caller that bounds it is not held to the bound.
func batchDeadline[T any](callers []T, deadline func(T) time.Time, timeout time.Duration) (end time.Time, ok bool) {
	for _, c := range callers {
		d := deadline(c)
		if d.IsZero() {
			return time.Time{}, false
		}
		if d.After(end) {
			end = d
		}
	}
	if len(callers) == 0 || !end.Before(time.Now().Add(timeout)) {
		return time.Time{}, false
	}
	return end, true
}

// passLead hands the lead to the first caller queued, or leaves the group
// idle. g.mu is held.
func (g *storeGroup[T]) passLead() {
	if len(g.queue) == 0 {
		g.running = false
		return
	}
	next := g.queue[0]
	next.leads = true
	next.wake <- struct{}{}
}

func waiterDeadline[T any](q *storeWaiter[T]) time.Time { return q.deadline }

// do runs w in a batch and returns once its outcome is in w, or with
// ctx's error if w was never sent.
func (g *storeGroup[T]) do(ctx context.Context, w *T) error {
	me := &storeWaiter[T]{w: w, wake: make(chan struct{}, 1)}
	me.deadline, _ = ctx.Deadline()
	g.mu.Lock()
	g.queue = append(g.queue, me)
	if g.running {
		g.mu.Unlock()
		select {
		case <-me.wake:
		case <-ctx.Done():
			g.mu.Lock()
			if !me.taken && !me.leads {
				g.queue = slices.DeleteFunc(g.queue, func(q *storeWaiter[T]) bool { return q == me })
				g.mu.Unlock()
				return ctx.Err()
			}
			g.mu.Unlock()
			<-me.wake
		}
		g.mu.Lock()
		if !me.leads {
			g.mu.Unlock()
			if me.lost {
				return errStoreBatchLost
			}
			return nil
		}
		if err := ctx.Err(); err != nil {
			// Handed the lead as its context ended: its write is still
			// queued, and is never sent; the lead goes on.
			g.queue = slices.DeleteFunc(g.queue, func(q *storeWaiter[T]) bool { return q == me })
			g.passLead()
			g.mu.Unlock()
			return err
		}
	}
	g.running = true
	n := min(len(g.queue), g.max)
	batch := make([]*T, n)
	waiters := g.queue[:n:n]
	for i, q := range waiters {
		q.taken = true
		batch[i] = q.w
	}
	g.queue = g.queue[n:]
	g.mu.Unlock()

	// Whatever run does, even panic, the batch's callers are woken and
	// the lead goes on: a group that stopped would hold every later write.
	ran := false
	defer func() {
		g.mu.Lock()
		g.passLead()
		g.mu.Unlock()
		for _, q := range waiters {
			if q != me {
				q.lost = !ran
				q.wake <- struct{}{}
			}
		}
	}()
	end, ok := batchDeadline(waiters, waiterDeadline[T], storeBatchTimeout)
	if !ok {
		end = time.Now().Add(storeBatchTimeout)
	}
	bctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), end)
	defer cancel()
	g.run(bctx, batch)
	ran = true
	return nil
}
