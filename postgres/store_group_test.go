package postgres

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type groupWrite struct {
	n    int
	done bool
}

// TestStoreGroupRunsEveryWriteOnce: writes from many goroutines at once
// are run in batches of at most max, each write in exactly one batch.
func TestStoreGroupRunsEveryWriteOnce(t *testing.T) {
	t.Parallel()
	const writers, max = 500, 16
	var (
		mu      sync.Mutex
		seen    = map[int]int{}
		batches []int
	)
	g := storeGroup[groupWrite]{max: max, run: func(_ context.Context, batch []*groupWrite) {
		mu.Lock()
		defer mu.Unlock()
		batches = append(batches, len(batch))
		for _, w := range batch {
			seen[w.n]++
			w.done = true
		}
	}}
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			w := groupWrite{n: i}
			assert.NoError(t, g.do(context.Background(), &w))
			assert.True(t, w.done, "do returned before its write ran")
		})
	}
	wg.Wait()
	require.Len(t, seen, writers)
	for n, times := range seen {
		require.Equal(t, 1, times, "write %d ran %d times", n, times)
	}
	for _, b := range batches {
		assert.LessOrEqual(t, b, max)
	}
	assert.False(t, g.running, "the group is idle once every write is done")
	t.Logf("%d writes in %d batches", writers, len(batches))
}

// TestStoreGroupQueuedWriteIsTakenBackOnCancel: a caller whose context ends
// while its write waits behind a running batch gets the context's error,
// and its write is never run; the callers behind it are run.
func TestStoreGroupQueuedWriteIsTakenBackOnCancel(t *testing.T) {
	t.Parallel()
	var (
		mu      sync.Mutex
		ran     []int
		entered = make(chan struct{}, 1)
		hold    = make(chan struct{})
	)
	g := storeGroup[groupWrite]{max: 8, run: func(_ context.Context, batch []*groupWrite) {
		mu.Lock()
		for _, w := range batch {
			ran = append(ran, w.n)
			w.done = true
		}
		mu.Unlock()
		select {
		case entered <- struct{}{}:
			<-hold // the first batch is held until the test lets it go
		default:
		}
	}}
	queued := func(n int) bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.queue) == n
	}
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, g.do(context.Background(), &groupWrite{n: 1})) })
	<-entered

	cctx, cancel := context.WithCancel(context.Background())
	canceled := make(chan error, 1)
	wg.Go(func() { canceled <- g.do(cctx, &groupWrite{n: 2}) })
	require.Eventually(t, func() bool { return queued(1) }, 10*time.Second, time.Millisecond)
	behind := groupWrite{n: 3}
	wg.Go(func() { assert.NoError(t, g.do(context.Background(), &behind)) })
	require.Eventually(t, func() bool { return queued(2) }, 10*time.Second, time.Millisecond)

	cancel()
	require.ErrorIs(t, <-canceled, context.Canceled)
	close(hold)
	wg.Wait()
	assert.Equal(t, []int{1, 3}, ran, "the canceled write never ran; the one behind it did")
	assert.True(t, behind.done)
}

// TestStoreGroupGoesOnAfterAPanic: a run that panics reaches its leader's
// caller; the other writes of its batch learn that their outcome is
// unknown, and the group keeps running later writes.
func TestStoreGroupGoesOnAfterAPanic(t *testing.T) {
	t.Parallel()
	entered, hold := make(chan struct{}, 1), make(chan struct{})
	g := storeGroup[groupWrite]{max: 8, run: func(_ context.Context, batch []*groupWrite) {
		for _, w := range batch {
			if w.n == 1 {
				entered <- struct{}{}
				<-hold
				return
			}
		}
		for _, w := range batch {
			if w.n == 2 {
				panic("boom")
			}
			w.done = true
		}
	}}
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, g.do(context.Background(), &groupWrite{n: 1})) })
	<-entered
	// 2 and 3 queue up behind 1, and run as one batch, led by 2.
	errs := make(chan error, 1)
	wg.Go(func() {
		defer func() { assert.Equal(t, "boom", recover()) }()
		_ = g.do(context.Background(), &groupWrite{n: 2})
	})
	require.Eventually(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.queue) == 1 }, 10*time.Second, time.Millisecond)
	wg.Go(func() { errs <- g.do(context.Background(), &groupWrite{n: 3}) })
	require.Eventually(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.queue) == 2 }, 10*time.Second, time.Millisecond)
	close(hold)
	require.ErrorIs(t, <-errs, errStoreBatchLost)
	wg.Wait()

	later := groupWrite{n: 4}
	require.NoError(t, g.do(context.Background(), &later))
	assert.True(t, later.done, "the group still runs writes")
}

// endedCtx is a context whose Err reports Canceled once ended is set,
// before its Done channel (never closed) says so: a caller whose context
// ended at the moment it is handed the lead, which its select then sees
// first.
type endedCtx struct {
	context.Context
	ended atomic.Bool
}

func (c *endedCtx) Err() error {
	if c.ended.Load() {
		return context.Canceled
	}
	return nil
}

// TestStoreGroupLeadWhoseContextEndedPassesItOnUnsent: a caller handed the
// lead after its context ended does not send its write (it was still
// queued: the group's promise), gets its context's error, and hands the
// lead on to the caller behind it, whose write runs.
func TestStoreGroupLeadWhoseContextEndedPassesItOnUnsent(t *testing.T) {
	t.Parallel()
	var (
		mu      sync.Mutex
		ran     []int
		entered = make(chan struct{}, 1)
		hold    = make(chan struct{})
	)
	ectx := &endedCtx{Context: context.Background()}
	g := storeGroup[groupWrite]{max: 1, run: func(_ context.Context, batch []*groupWrite) {
		mu.Lock()
		for _, w := range batch {
			ran = append(ran, w.n)
			w.done = true
		}
		mu.Unlock()
		select {
		case entered <- struct{}{}:
			<-hold
			ectx.ended.Store(true) // as the lead is handed on
		default:
		}
	}}
	queued := func(n int) bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.queue) == n
	}
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, g.do(context.Background(), &groupWrite{n: 1})) })
	<-entered
	ended := make(chan error, 1)
	wg.Go(func() { ended <- g.do(ectx, &groupWrite{n: 2}) })
	require.Eventually(t, func() bool { return queued(1) }, 10*time.Second, time.Millisecond)
	behind := groupWrite{n: 3}
	wg.Go(func() { assert.NoError(t, g.do(context.Background(), &behind)) })
	require.Eventually(t, func() bool { return queued(2) }, 10*time.Second, time.Millisecond)

	close(hold)
	require.ErrorIs(t, <-ended, context.Canceled)
	wg.Wait()
	assert.Equal(t, []int{1, 3}, ran, "the write whose caller's context ended never ran; the one behind it did")
	assert.True(t, behind.done)
	assert.False(t, g.running, "the group is idle once every write is done")
}
