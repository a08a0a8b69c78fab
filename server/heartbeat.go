package server

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// heartbeat renews a running handler's lock every LockTimeout/3, so that
// only a lock whose process died goes stale: a slow handler is never taken
// over while it still runs.
type heartbeat struct {
	mu      sync.Mutex
	stopped bool
	timer   *time.Timer
	running sync.WaitGroup
}

func (m *Middleware) startHeartbeat(scope, key string, token int64) *heartbeat {
	hb := &heartbeat{}
	every := m.cfg.LockTimeout / 3
	beat := func() {
		hb.mu.Lock()
		if hb.stopped {
			hb.mu.Unlock()
			return
		}
		hb.running.Add(1)
		hb.mu.Unlock()
		defer hb.running.Done()
		ctx, cancel := context.WithTimeout(context.Background(), every)
		err := m.cfg.Store.Renew(ctx, scope, key, token, m.cfg.now())
		cancel()
		if errors.Is(err, ErrLockLost) {
			return // taken over or finished: nothing left to renew
		}
		if err != nil {
			m.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idempotency lock renewal failed",
				slog.String("key_hash", keyHash(scope, key)), slog.Any("error", err))
		}
		hb.mu.Lock()
		if !hb.stopped {
			hb.timer.Reset(every)
		}
		hb.mu.Unlock()
	}
	hb.mu.Lock()
	hb.timer = time.AfterFunc(every, beat)
	hb.mu.Unlock()
	return hb
}

// stop ends the heartbeat and waits for a renewal in progress, so that no
// renewal outlives the request. It may be called more than once.
func (hb *heartbeat) stop() {
	hb.mu.Lock()
	hb.stopped = true
	hb.timer.Stop()
	hb.mu.Unlock()
	hb.running.Wait()
}
