package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/wire"
)

// Middleware makes a service's state-changing routes idempotent: see the
// package documentation. Create it with New; it is safe for concurrent use,
// and one Middleware may wrap any number of handlers.
type Middleware struct {
	cfg        Config
	header     string
	methods    map[string]bool
	retryAfter string

	stopSweeper context.CancelFunc
	sweeperDone chan struct{}
	closeOnce   sync.Once
}

// New checks cfg, fills in the defaults and starts the sweeper that
// deletes expired entries every SweepInterval. It returns a *ConfigError
// naming the first field it cannot accept. Close stops the sweeper.
func New(cfg Config) (*Middleware, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m := &Middleware{
		cfg:        cfg,
		header:     http.CanonicalHeaderKey(cfg.Header),
		methods:    make(map[string]bool, len(cfg.Methods)),
		retryAfter: retryAfter(cfg.RetryAfter),
	}
	for _, method := range cfg.Methods {
		m.methods[method] = true
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.stopSweeper, m.sweeperDone = cancel, make(chan struct{})
	go m.sweepLoop(ctx)
	return m, nil
}

// Close stops the sweeper and waits for it. It does not close the Store,
// which belongs to the caller, and handlers keep working after it. Close
// may be called more than once.
func (m *Middleware) Close() error {
	m.closeOnce.Do(func() {
		m.stopSweeper()
		<-m.sweeperDone
	})
	return nil
}

func (m *Middleware) sweepLoop(ctx context.Context) {
	defer close(m.sweeperDone)
	t := time.NewTicker(m.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			sctx, cancel := context.WithTimeout(ctx, m.cfg.SweepInterval)
			_, _ = m.Sweep(sctx)
			cancel()
		}
	}
}

// Sweep deletes the entries that expired, as the sweeper does every
// SweepInterval, and returns how many it deleted.
func (m *Middleware) Sweep(ctx context.Context) (int, error) {
	n, err := m.cfg.Store.Sweep(ctx, m.cfg.now())
	if err != nil {
		m.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idempotency store sweep failed", slog.Any("error", err))
	} else if n > 0 {
		m.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "idempotency entries swept", slog.Int("count", n))
	}
	return n, err
}

type keyContextKey struct{}

// KeyFromContext returns the idempotency key of the request being handled,
// as the middleware put it in the handler's request context. Store it with
// the application's own record under a UNIQUE constraint on (tenant, key):
// if the handler ever runs twice for one key (its first run died after
// committing, or its response was lost in a power failure), the constraint
// turns the second run into a lookup of the first run's result.
func KeyFromContext(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyContextKey{}).(string)
	return k, ok
}

// Handler wraps next: requests with one of Config.Methods must carry a key
// and run next at most once per (scope, key) while the entry is kept; other
// requests go straight to next.
//
// The handler's response is buffered in full, stored, and only then sent:
// next cannot stream, and http.ResponseController's Flush and Hijack report
// http.ErrNotSupported. Its request context carries the key
// (KeyFromContext) and is not canceled when the client goes away, so that
// work a client started completes and is stored for its retry.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !m.methods[r.Method] {
			next.ServeHTTP(w, r)
			return
		}
		m.serve(next, w, r)
	})
}

func (m *Middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	key, ok := m.readKey(w, r)
	if !ok {
		return
	}
	body, ok := m.readBody(w, r, key)
	if !ok {
		return
	}
	scope := m.cfg.Scope(r)
	fp := fingerprint(r.Method, target(r.URL), body)
	now := m.cfg.now()
	res, err := m.cfg.Store.Claim(r.Context(), ClaimRequest{
		Scope: scope, Key: key, Fingerprint: fp, Method: r.Method, Path: r.URL.Path,
		Now: now, ExpiresAt: now.Add(m.cfg.Retention), StaleBefore: now.Add(-m.cfg.LockTimeout),
	})
	if err != nil {
		level := slog.LevelError
		if r.Context().Err() != nil {
			level = slog.LevelDebug // the client left before its key was recorded
		}
		m.log(r.Context(), level, "idempotency claim failed; the request was not run", r, scope, key, slog.Any("error", err))
		m.problemStoreFailed(w, key, "The idempotency key could not be recorded, so the request was not run; retry with the same key.")
		return
	}
	if !res.Claimed {
		m.answerExisting(w, r, key, fp, &res.Entry)
		return
	}
	if res.TookOver {
		m.log(r.Context(), slog.LevelWarn, "idempotency lock was stale; running the request again", r, scope, key,
			slog.Time("created_at", res.Entry.CreatedAt))
	}
	m.execute(next, w, r, body, scope, key, res.Token)
}

// execute runs next under a claimed key, stores its response, then sends it.
func (m *Middleware) execute(next http.Handler, w http.ResponseWriter, r *http.Request, body []byte, scope, key string, token int64) {
	// Storing and releasing must happen even if the client is gone: its
	// retry is what the stored response is for.
	bg := context.WithoutCancel(r.Context())
	hctx := context.WithValue(bg, keyContextKey{}, key)
	hr := r.WithContext(hctx)
	hr.Body = io.NopCloser(bytes.NewReader(body))
	hr.ContentLength = int64(len(body))
	hr.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }

	hb := m.startHeartbeat(scope, key, token)
	c := newCapture()
	returned := false
	defer func() {
		hb.stop()
		if !returned {
			// A panic (or runtime.Goexit) in next: free the key so that a
			// retry runs the request again, and let the panic go on.
			if err := m.cfg.Store.Release(bg, scope, key, token); err != nil {
				m.log(bg, slog.LevelError, "idempotency key not released after a panic", r, scope, key, slog.Any("error", err))
			}
		}
	}()
	next.ServeHTTP(c, hr)
	returned = true
	hb.stop()

	resp := c.response()
	if resp.Status >= 500 && m.cfg.StorePolicy == SkipServerErrors {
		if err := m.cfg.Store.Release(bg, scope, key, token); err != nil {
			m.log(bg, slog.LevelError, "idempotency key not released after a server error", r, scope, key, slog.Any("error", err))
		}
		writeStored(w, resp, c.cookies(), false)
		return
	}
	err := m.cfg.Store.Complete(bg, CompleteRequest{
		Scope: scope, Key: key, Token: token, Response: resp, ExpiresAt: m.cfg.now().Add(m.cfg.Retention),
	})
	switch {
	case errors.Is(err, ErrLockLost):
		// Another request took the entry over while this one ran: its
		// response, not this one, is what the key stands for.
		m.log(bg, slog.LevelWarn, "idempotency lock lost while the handler ran; its response is not sent", r, scope, key)
		m.problemInProgress(w, key)
	case err != nil:
		m.log(bg, slog.LevelError, "idempotency response could not be stored; it is not sent", r, scope, key, slog.Any("error", err))
		if rerr := m.cfg.Store.Release(bg, scope, key, token); rerr != nil {
			m.log(bg, slog.LevelError, "idempotency key not released", r, scope, key, slog.Any("error", rerr))
		}
		m.problemStoreFailed(w, key, "The request ran but its response could not be recorded; retry with the same key.")
	default:
		writeStored(w, resp, c.cookies(), false)
	}
}

// answerExisting answers a request whose key is held by an entry it could
// not claim.
func (m *Middleware) answerExisting(w http.ResponseWriter, r *http.Request, key, fp string, e *Entry) {
	switch {
	case e.Fingerprint != fp:
		m.problemKeyReused(w, r, key, e)
	case e.State == Completed && e.Response != nil:
		writeStored(w, e.Response, nil, true)
	default:
		m.problemInProgress(w, key)
	}
}

// writeStored sends a stored response, with the Set-Cookie values of the
// first response only, and the replay mark on a replay.
func writeStored(w http.ResponseWriter, resp *StoredResponse, cookies []string, replayed bool) {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = append([]string(nil), v...)
	}
	if len(cookies) > 0 {
		h["Set-Cookie"] = cookies
	}
	if replayed {
		h.Set(wire.ReplayedHeader, "true")
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

func (m *Middleware) log(ctx context.Context, level slog.Level, msg string, r *http.Request, scope, key string, attrs ...slog.Attr) {
	if !m.cfg.Logger.Enabled(ctx, level) {
		return
	}
	attrs = append([]slog.Attr{
		slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("key_hash", keyHash(scope, key)),
	}, attrs...)
	m.cfg.Logger.LogAttrs(ctx, level, msg, attrs...)
}
