package postgres

import (
	"context"
	"sync"
	"time"
)

// batchTimeout bounds one batch's transaction: a server that stops
// answering must not hold the batch's writers, and its connection, for
// ever. The batch runs on a context of its own: one caller giving up must
// not fail the others' writes.
const batchTimeout = 30 * time.Second

// batchWatchTick is how often the watch looks at the running batches: a
// batch is canceled between batchTimeout and batchTimeout plus a tick
// after it began.
const batchWatchTick = time.Second

// batchWatch bounds the running batches (batchTimeout) with one goroutine
// and one timer for all of them, which runs while any batch runs, instead
// of a context.WithTimeout, and its timer, per batch. Measured at one
// caller (a Create and its settling Update, rounds alternating the two in
// one process, nine runs), the timer made and stopped per write cost a
// median 8 % of the process's CPU for the two writes (-5 % to +16 % from
// run to run, on a busy machine): made, it is often the soonest of the
// process's timers, and wakes the thread that waits in the network poller
// (see BENCHMARKS.md, "Ninth speed session").
type batchWatch struct {
	limit, tick time.Duration

	mu      sync.Mutex
	running map[*watchedBatch]struct{}
	active  bool          // the goroutine runs
	stopped bool          // the journal closed: no batch runs any more
	wake    chan struct{} // closed by stop, to end the goroutine at once
	done    sync.WaitGroup
}

type watchedBatch struct {
	start  time.Time
	cancel context.CancelFunc
}

func newBatchWatch(limit, tick time.Duration) *batchWatch {
	return &batchWatch{limit: limit, tick: tick, running: map[*watchedBatch]struct{}{}, wake: make(chan struct{})}
}

// begin returns the context of a batch, canceled once it has run past the
// limit, and the function that ends it, which the batch must call.
func (w *batchWatch) begin() (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	b := &watchedBatch{start: time.Now(), cancel: cancel}
	w.mu.Lock()
	w.running[b] = struct{}{}
	if !w.active && !w.stopped {
		w.active = true
		w.done.Add(1)
		go w.watch()
	}
	w.mu.Unlock()
	return ctx, func() {
		w.mu.Lock()
		delete(w.running, b)
		w.mu.Unlock()
		cancel()
	}
}

// watch cancels the batches that have run past the limit, every tick,
// until it finds none running, or the journal closes.
func (w *batchWatch) watch() {
	defer w.done.Done()
	t := time.NewTimer(w.tick)
	defer t.Stop()
	for {
		select {
		case <-w.wake:
			return
		case <-t.C:
		}
		now := time.Now()
		w.mu.Lock()
		if len(w.running) == 0 {
			w.active = false
			w.mu.Unlock()
			return
		}
		for b := range w.running {
			if now.Sub(b.start) >= w.limit {
				b.cancel()
			}
		}
		w.mu.Unlock()
		t.Reset(w.tick)
	}
}

// stop ends the goroutine, once no batch runs (Journal.Close), and waits
// for it.
func (w *batchWatch) stop() {
	w.mu.Lock()
	if !w.stopped {
		w.stopped = true
		close(w.wake)
	}
	w.mu.Unlock()
	w.done.Wait()
}
