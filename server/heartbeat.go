package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/wire"
)

// ErrLockNotRenewed is the cause (context.Cause) with which a handler's
// context is canceled when its lock could not be kept: no renewal succeeded
// for 2/3 of LockTimeout (the store is unreachable from this process), or
// a renewal found the key taken over (the cause then also matches
// ErrLockLost). From LockTimeout on, another request with the key may run
// the handler; a handler that sees this cause should stop. If it then
// fails (5xx or panic), the failure is taken for the interruption's: it is
// not stored, and the key is run again once its lock is stale. An answer
// below 500 is stored as usual, unless the key was taken over.
var ErrLockNotRenewed = errors.New("idem server: the key's lock could not be renewed; another request may take the key over")

// heartbeat keeps a claimed key's lock fresh from the claim until the
// response is stored (or the key released): it renews the lock every
// LockTimeout/3, so that only a lock whose process died or lost its store
// goes stale, and a slow handler is never taken over while it can still be
// told apart from a dead one.
//
// When no renewal succeeded for 2/3 of LockTimeout, the watchdog cancels
// the handler's context with ErrLockNotRenewed: the lock goes stale at
// LockTimeout, when another request may take the key over, and by then the
// handler must have been told to stop.
type heartbeat struct {
	m          *Middleware
	scope, key string
	token      int64
	every      time.Duration // between renewals
	bound      time.Duration // without a successful renewal before the handler is told to stop
	lose       context.CancelCauseFunc

	// ctx is canceled by stop, so that a renewal in flight does not hold
	// up the end of a request or Close. Like the watchdog, it is made by
	// the first renewal (under mu): a handler that answers within
	// LockTimeout/3, as most do, costs one timer and nothing else.
	ctx    context.Context
	cancel context.CancelFunc

	// op is held across every store call on the entry, renewals and
	// Complete alike (a channel of one, so that a Complete can stop
	// waiting for it): a renewal never races the Complete that ends the
	// lock, so it never mistakes a stored response for a lost lock. A
	// Complete gives it back after completeBound even if the store has
	// not answered (see complete).
	op chan struct{}
	// completeBound bounds how long a Complete waits for op and for the
	// store; callBound is the store call's own deadline. See
	// Middleware.completeBound.
	completeBound, callBound time.Duration
	// pending is the outcome of a Complete the store has not answered
	// within completeBound, nil if none: the next complete waits for it
	// instead of sending another. Guarded by op.
	pending chan error

	mu       sync.Mutex
	stopped  bool
	told     bool      // the handler's context was canceled
	deadline time.Time // when the watchdog fires, unless a renewal succeeds
	timer    *time.Timer
	watchdog *time.Timer    // nil until the first renewal
	running  sync.WaitGroup // renewals and watchdog firings in progress
}

// startHeartbeat starts renewing the lock that token holds on (scope, key).
// lockedAt is when the lock was last known fresh, in this process's time:
// the moment before the claim was sent. lose cancels the handler's context.
//
// It arms one timer, for the first renewal. The watchdog, due at 2/3 of
// LockTimeout from lockedAt, is armed by that first renewal before it
// calls the store: it fires at the same moment as if it had been armed
// here, and a handler that finishes before the first renewal, as most do,
// never needs it. The first renewal comes after LockTimeout/3, or at the
// watchdog's due time if that is sooner (a claim that took that long).
func (m *Middleware) startHeartbeat(scope, key string, token int64, lockedAt time.Time, lose context.CancelCauseFunc) *heartbeat {
	hb := &heartbeat{
		m: m, scope: scope, key: key, token: token,
		every: m.cfg.LockTimeout / 3, bound: 2 * m.cfg.LockTimeout / 3, lose: lose,
		completeBound: m.completeBound(), callBound: m.storeCallBound(), op: make(chan struct{}, 1),
	}
	hb.mu.Lock()
	hb.deadline = lockedAt.Add(hb.bound)
	hb.timer = time.AfterFunc(min(hb.every, time.Until(hb.deadline)), hb.beat)
	hb.mu.Unlock()
	return hb
}

// arm makes, on the first renewal, what only a handler that runs past
// LockTimeout/3 needs: the watchdog and the renewals' context. It reports
// false, arming nothing, once the heartbeat stopped.
func (hb *heartbeat) arm() (context.Context, bool) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if hb.stopped {
		return nil, false
	}
	if hb.watchdog == nil {
		hb.ctx, hb.cancel = context.WithCancel(context.Background())
		hb.watchdog = time.AfterFunc(time.Until(hb.deadline), hb.expire)
	}
	return hb.ctx, true
}

// enter registers a renewal or a firing of the watchdog, unless the
// heartbeat stopped.
func (hb *heartbeat) enter() bool {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if hb.stopped {
		return false
	}
	hb.running.Add(1)
	return true
}

func (hb *heartbeat) isStopped() bool {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	return hb.stopped
}

func (hb *heartbeat) beat() {
	if !hb.enter() {
		return
	}
	defer hb.running.Done()
	rctx, ok := hb.arm()
	if !ok {
		return
	}
	hb.op <- struct{}{}
	if hb.isStopped() {
		<-hb.op
		return
	}
	started := time.Now()
	// A slow renewal that succeeds before the watchdog fires keeps the
	// handler running: it may take until then, and at least one interval.
	hb.mu.Lock()
	limit := max(time.Until(hb.deadline), hb.every)
	hb.mu.Unlock()
	ctx, cancel := context.WithTimeout(rctx, limit)
	err := hb.m.cfg.Store.Renew(ctx, hb.scope, hb.key, hb.token, hb.m.cfg.now())
	cancel()
	completing := hb.pending != nil
	<-hb.op
	switch {
	case errors.Is(err, ErrLockLost) && completing:
		// A Complete still in flight (see complete) most likely stored
		// the response: the lock is not lost, it ended. If another
		// request took the key over instead, that Complete reports it.
		// Either way there is nothing left to renew.
		return
	case err == nil:
		hb.mu.Lock()
		if !hb.stopped && !hb.told {
			hb.deadline = started.Add(hb.bound)
			hb.watchdog.Reset(time.Until(hb.deadline))
		}
		hb.mu.Unlock()
	case errors.Is(err, ErrLockLost):
		// Another request took the key over: this run must stop now, and
		// there is nothing left to renew.
		hb.tell(fmt.Errorf("%w: %w", ErrLockNotRenewed, ErrLockLost), "idempotency lock lost to another request; the handler's context is canceled")
		return
	case hb.isStopped():
		return // stop ended this renewal
	default:
		hb.m.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idempotency lock renewal failed",
			slog.String("key_hash", wire.KeyHash(hb.scope, hb.key)), slog.Any("error", err))
	}
	hb.mu.Lock()
	if !hb.stopped {
		hb.timer.Reset(hb.every)
	}
	hb.mu.Unlock()
}

// expire is the watchdog: no renewal succeeded for 2/3 of LockTimeout.
func (hb *heartbeat) expire() {
	if !hb.enter() {
		return
	}
	defer hb.running.Done()
	hb.tell(ErrLockNotRenewed, "idempotency lock not renewed for 2/3 of LockTimeout; the handler's context is canceled before another request may take the key over")
}

// tell cancels the handler's context with cause, once.
func (hb *heartbeat) tell(cause error, msg string) {
	hb.mu.Lock()
	first := !hb.told
	hb.told = true
	hb.mu.Unlock()
	if !first {
		return
	}
	hb.lose(cause)
	hb.m.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn, msg, slog.String("key_hash", wire.KeyHash(hb.scope, hb.key)))
}

// wasTold reports whether the handler's context was canceled because the
// lock could not be kept.
func (hb *heartbeat) wasTold() bool {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	return hb.told
}

// errCompletePending: the store has not answered a Complete in time; it
// goes on, and the next try waits for its outcome.
var errCompletePending = errors.New("idem server: the store did not answer Complete")

// complete stores the response with the heartbeat's token, waiting at
// most completeBound for op and for the store: the request's context has
// no deadline, and a store call that hangs (a silent session; a store that
// holds a batch past its caller's deadline, as the PostgreSQL store may)
// must neither hang the request nor keep the renewals from running, or the
// lock would go stale with the store reachable and another request would
// run the handler again. A Complete the store has not answered in time goes
// on (its outcome, pending, is what the next complete waits for, so that
// one completion at a time is in flight) and complete reports an error
// matching context.DeadlineExceeded: the caller tries again later, and the
// heartbeat renews in between. Once the entry is no longer the
// heartbeat's to renew (the response is stored, or the lock was lost),
// the heartbeat stops.
func (hb *heartbeat) complete(ctx context.Context, req CompleteRequest) error {
	timeout := time.NewTimer(hb.completeBound)
	defer timeout.Stop()
	select {
	case hb.op <- struct{}{}:
	case <-timeout.C:
		return fmt.Errorf("idem server: a renewal of the key's lock held the store for %s: %w", hb.completeBound, context.DeadlineExceeded)
	case <-ctx.Done():
		return ctx.Err()
	}
	if hb.pending == nil {
		done := make(chan error, 1)
		hb.pending = done
		cctx, cancel := context.WithTimeout(ctx, hb.callBound)
		hb.running.Add(1) // stop waits for it: no store call outlives Close
		go func() {
			defer hb.running.Done()
			defer cancel()
			done <- hb.m.cfg.Store.Complete(cctx, req)
		}()
	}
	var err error
	select {
	case err = <-hb.pending:
		hb.pending = nil
	case <-timeout.C:
		err = fmt.Errorf("%w within %s: %w", errCompletePending, hb.completeBound, context.DeadlineExceeded)
	case <-ctx.Done():
		err = ctx.Err()
	}
	done := err == nil || errors.Is(err, ErrLockLost)
	if done {
		hb.halt() // before a renewal waiting for op can start
	}
	<-hb.op
	if done {
		hb.stop()
	}
	return err
}

// halt stops the timers; renewals in progress see stopped and end. It
// returns the renewals' context's cancel, nil if no renewal began.
func (hb *heartbeat) halt() context.CancelFunc {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	hb.stopped = true
	hb.timer.Stop()
	if hb.watchdog != nil {
		hb.watchdog.Stop()
	}
	return hb.cancel
}

// stop ends the heartbeat and waits for a renewal in progress, canceling
// it, so that no renewal outlives the request or Close. It may be called
// more than once.
func (hb *heartbeat) stop() {
	if cancel := hb.halt(); cancel != nil {
		cancel()
	}
	hb.running.Wait()
}
