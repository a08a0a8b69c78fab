package server

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// heartbeat keeps a claimed key's lock fresh from the claim until the
// response is stored (or the key released): it renews the lock every
// LockTimeout/3, so that only a lock whose process died or lost its store
// goes stale: a slow handler is never taken over while it still runs.
type heartbeat struct {
	m          *Middleware
	scope, key string
	token      int64
	every      time.Duration // between renewals

	// ctx is canceled by stop, so that a renewal in flight does not hold
	// up the end of a request or Close.
	ctx    context.Context
	cancel context.CancelFunc

	// op is held across every store call on the entry, renewals and
	// Complete alike: a renewal never races the Complete that ends the
	// lock, so it never mistakes a stored response for a lost lock.
	op sync.Mutex

	mu      sync.Mutex
	stopped bool
	timer   *time.Timer
	running sync.WaitGroup // renewals in progress
}

// startHeartbeat starts renewing the lock that token holds on (scope, key).
func (m *Middleware) startHeartbeat(scope, key string, token int64) *heartbeat {
	hb := &heartbeat{m: m, scope: scope, key: key, token: token, every: m.cfg.LockTimeout / 3}
	hb.ctx, hb.cancel = context.WithCancel(context.Background())
	hb.mu.Lock()
	hb.timer = time.AfterFunc(hb.every, hb.beat)
	hb.mu.Unlock()
	return hb
}

// enter registers a renewal, unless the heartbeat stopped.
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
	hb.op.Lock()
	if hb.isStopped() {
		hb.op.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(hb.ctx, hb.every)
	err := hb.m.cfg.Store.Renew(ctx, hb.scope, hb.key, hb.token, hb.m.cfg.now())
	cancel()
	hb.op.Unlock()
	switch {
	case err == nil:
	case errors.Is(err, ErrLockLost):
		return // taken over: nothing left to renew
	case hb.isStopped():
		return // stop ended this renewal
	default:
		hb.m.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idempotency lock renewal failed",
			slog.String("key_hash", keyHash(hb.scope, hb.key)), slog.Any("error", err))
	}
	hb.mu.Lock()
	if !hb.stopped {
		hb.timer.Reset(hb.every)
	}
	hb.mu.Unlock()
}

// complete stores the response with the heartbeat's token. Once the entry
// is no longer the heartbeat's to renew (the response is stored, or the
// lock was lost), the heartbeat stops.
func (hb *heartbeat) complete(ctx context.Context, req CompleteRequest) error {
	hb.op.Lock()
	err := hb.m.cfg.Store.Complete(ctx, req)
	done := err == nil || errors.Is(err, ErrLockLost)
	if done {
		hb.halt() // before a renewal waiting for op can start
	}
	hb.op.Unlock()
	if done {
		hb.stop()
	}
	return err
}

// halt stops the timers; renewals in progress see stopped and end.
func (hb *heartbeat) halt() {
	hb.mu.Lock()
	hb.stopped = true
	hb.timer.Stop()
	hb.mu.Unlock()
}

// stop ends the heartbeat and waits for a renewal in progress, canceling
// it, so that no renewal outlives the request or Close. It may be called
// more than once.
func (hb *heartbeat) stop() {
	hb.halt()
	hb.cancel()
	hb.running.Wait()
}
