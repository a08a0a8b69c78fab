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

	// life is canceled by Close. It bounds the middleware's own
	// goroutines: the sweeper, and the storing of responses whose first
	// attempt to store failed.
	life      context.Context
	end       context.CancelFunc
	mu        sync.Mutex
	closed    bool
	owned     sync.WaitGroup
	closeOnce sync.Once
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
	m.life, m.end = context.WithCancel(context.Background())
	m.spawn(m.sweepLoop)
	return m, nil
}

// Close stops the sweeper and the storing of responses that could not be
// stored yet, and waits for both (and for a Complete already sent, which
// its LockTimeout deadline bounds). A response still unstored stays so: its
// key remains in progress until its lock goes stale (LockTimeout), as if
// the process had died, and the error log names it. Close does not close
// the Store, which belongs to the caller; call it once the HTTP server has
// shut down, as handlers that run after it can no longer retry storing
// their responses. Close may be called more than once.
func (m *Middleware) Close() error {
	m.closeOnce.Do(func() {
		m.mu.Lock()
		m.closed = true
		m.mu.Unlock()
		m.end()
		m.owned.Wait()
	})
	return nil
}

// spawn runs f on a goroutine that Close stops (through ctx) and waits
// for. Once Close has begun it runs nothing and reports false.
func (m *Middleware) spawn(f func(ctx context.Context)) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.owned.Add(1)
	go func() {
		defer m.owned.Done()
		f(m.life)
	}()
	return true
}

func (m *Middleware) sweepLoop(ctx context.Context) {
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

// keyContext carries the key for KeyFromContext: context.WithValue's
// work, without boxing the key into an interface on every request.
type keyContext struct {
	context.Context
	key string
}

func (c *keyContext) Value(k any) any {
	if _, ok := k.(keyContextKey); ok {
		return c.key
	}
	return c.Context.Value(k)
}

// bodyReader is the handler's request body: the body the middleware read,
// from its start.
type bodyReader struct{ bytes.Reader }

func newBodyReader(body []byte) *bodyReader {
	b := new(bodyReader)
	b.Reset(body)
	return b
}

func (*bodyReader) Close() error { return nil }

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
// work a client started completes and is stored for its retry. It is
// canceled, with ErrLockNotRenewed as its cause, when the key's lock can no
// longer be kept.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !m.methods[r.Method] {
			next.ServeHTTP(w, r)
			return
		}
		// A request whose handler panicked is reported too, as the
		// panic unwinds: serve never returns, and execute fills panicked.
		var panicked Outcome
		defer func() {
			if panicked.Kind != 0 {
				m.report(r.Context(), panicked)
			}
		}()
		o := m.serve(next, w, r, &panicked)
		m.report(r.Context(), o)
	})
}

// claimed is a key this request holds, and what it needs to end the hold.
type claimed struct {
	scope, key   string
	method, path string // for the logs, which outlive the request
	token        int64
	// expiresAt is when the in-progress entry expires: no response is
	// stored after it.
	expiresAt time.Time
	tookOver  bool
	hb        *heartbeat
}

func (m *Middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request, panicked *Outcome) Outcome {
	key, ok := m.readKey(w, r)
	if !ok {
		return Outcome{Kind: OutcomeKeyInvalid, Status: http.StatusBadRequest}
	}
	body, status := m.readBody(w, r, key)
	if status != 0 {
		return Outcome{Kind: OutcomeKeyInvalid, Key: key, Status: status}
	}
	scope := m.cfg.Scope(r)
	fp := fingerprint(r.Method, target(r.URL), body)
	now := m.cfg.now()
	// The lock is fresh from before the claim is sent, in this process's
	// own time: what the heartbeat's watchdog counts from.
	lockedAt := time.Now()
	// A claim that takes LockTimeout hands back a lock already stale; bound
	// it there, so that a store call that hangs (a silent session, which
	// the PostgreSQL store's batch would otherwise wait on for 30 s,
	// holding every claim queued behind it) answers 503 instead.
	cctx, cancel := context.WithTimeout(r.Context(), m.cfg.LockTimeout)
	res, err := m.cfg.Store.Claim(cctx, ClaimRequest{
		Scope: scope, Key: key, Fingerprint: fp, Method: r.Method, Path: r.URL.Path,
		Now: now, ExpiresAt: now.Add(m.cfg.Retention), StaleBefore: now.Add(-m.cfg.LockTimeout),
	})
	cancel()
	if errors.Is(err, ErrUnstorable) {
		m.log(r.Context(), slog.LevelWarn, "idempotency store refused the request; it was not run", r, scope, key, slog.Any("error", err))
		writeProblem(w, wire.Problem{Type: wire.ProblemUnstorable, Status: http.StatusBadRequest, Title: "Request cannot be recorded",
			Detail: "The idempotency store cannot keep this request, so it was not run, and the same request will be refused again: " +
				err.Error() + ".", Key: key})
		return Outcome{Kind: OutcomeKeyInvalid, Scope: scope, Key: key, Status: http.StatusBadRequest}
	}
	if err != nil {
		level := slog.LevelError
		if r.Context().Err() != nil {
			level = slog.LevelDebug // the client left before its key was recorded
		}
		m.log(r.Context(), level, "idempotency claim failed; the request was not run", r, scope, key, slog.Any("error", err))
		m.problemStoreFailed(w, key, "The idempotency key could not be recorded, so the request was not run; retry with the same key.")
		return Outcome{Kind: OutcomeStoreUnavailable, Scope: scope, Key: key, Status: http.StatusServiceUnavailable, StoreFailed: true}
	}
	if !res.Claimed {
		o := m.answerExisting(w, r, key, fp, &res.Entry)
		o.Scope = scope
		return o
	}
	if res.TookOver {
		m.log(r.Context(), slog.LevelWarn, "idempotency lock was stale; running the request again", r, scope, key,
			slog.Time("created_at", res.Entry.CreatedAt))
	}
	o := m.execute(next, w, r, body, &claimed{
		scope: scope, key: key, method: r.Method, path: r.URL.Path,
		token: res.Token, expiresAt: res.Entry.ExpiresAt, tookOver: res.TookOver,
	}, lockedAt, panicked)
	o.Scope, o.Key, o.TookOver = scope, key, res.TookOver
	return o
}

// execute runs next under a claimed key, stores its response, then sends
// it. Once next has run, the key is never released for another run unless
// the application opted into SkipServerErrors: whatever fails after that,
// the key stays held until its response is stored, and the client is told
// the request is in progress. The one exception is a run the middleware
// itself told to stop that then failed (see interrupted): its key is left
// to go stale, as a dead process's would.
//
// If next panics, execute fills panicked with the request's outcome before
// the panic goes on.
func (m *Middleware) execute(next http.Handler, w http.ResponseWriter, r *http.Request, body []byte, cl *claimed, lockedAt time.Time, panicked *Outcome) Outcome {
	// Storing and releasing must happen even if the client is gone: its
	// retry is what the stored response is for.
	bg := context.WithoutCancel(r.Context())
	hctx, cancel := context.WithCancelCause(&keyContext{Context: bg, key: cl.key})
	defer cancel(context.Canceled)
	hr := r.WithContext(hctx)
	hr.Body = newBodyReader(body)
	hr.ContentLength = int64(len(body))
	hr.GetBody = func() (io.ReadCloser, error) { return newBodyReader(body), nil }

	cl.hb = m.startHeartbeat(cl.scope, cl.key, cl.token, lockedAt, cancel)
	c := newCapture()
	returned := false
	defer func() {
		if !returned {
			// A panic (or runtime.Goexit) in next, which goes on once
			// this returns.
			*panicked = Outcome{Kind: OutcomeRan, Scope: cl.scope, Key: cl.key, Status: http.StatusInternalServerError,
				TookOver: cl.tookOver, StoreFailed: m.afterPanic(bg, cl) == storing}
		}
	}()
	next.ServeHTTP(c, hr)
	returned = true

	resp, cookies := c.response()
	ran := Outcome{Kind: OutcomeRan, Status: resp.Status}
	if resp.Status >= 500 && m.cfg.StorePolicy == SkipServerErrors {
		m.release(bg, cl, "a server error")
		writeStored(w, resp, cookies, false)
		return ran
	}
	ran.Status = http.StatusConflict
	if resp.Status >= 500 && cl.hb.wasTold() {
		m.interrupted(bg, cl)
		m.problemInProgress(w, cl.key, "The request was interrupted: its hold on the idempotency key could not be kept. Retry with the same key after the delay in Retry-After, or ask the status endpoint.")
		return ran
	}
	switch m.store(bg, cl, resp) {
	case stored:
		writeStored(w, resp, cookies, false)
		ran.Status = resp.Status
	case lockLost:
		// Another request took the entry over while this one ran: its
		// response, not this one, is what the key stands for.
		m.problemInProgress(w, cl.key, "")
	case storing:
		m.problemInProgress(w, cl.key, "The request ran, and its response is being recorded; retry with the same key after the delay in Retry-After, or ask the status endpoint.")
		ran.StoreFailed = true
	}
	return ran
}

// afterPanic ends the hold of a key whose handler panicked: by default the
// key's outcome becomes a stored 500 problem, because the handler may have
// acted before it panicked; under SkipServerErrors the key is released. It
// returns what became of the stored 500, 0 when none was stored.
func (m *Middleware) afterPanic(ctx context.Context, cl *claimed) storeResult {
	if m.cfg.StorePolicy == SkipServerErrors {
		m.release(ctx, cl, "a panic")
		return 0
	}
	if cl.hb.wasTold() {
		m.interrupted(ctx, cl)
		return 0
	}
	m.logKey(ctx, slog.LevelError, "idempotency handler panicked; a 500 is stored for its key", cl)
	return m.store(ctx, cl, panicResponse(cl.key))
}

// interrupted ends the hold of a key whose handler failed (5xx or panic)
// after the middleware told it to stop, because its lock could not be
// kept. The failure is the interruption's, not the request's: it is not
// stored, and the key is left as a process that died would leave it. Its
// lock, no longer renewed, goes stale, and the next request with the key
// runs the handler again, which the application's own guard answers.
func (m *Middleware) interrupted(ctx context.Context, cl *claimed) {
	cl.hb.stop()
	m.logKey(ctx, slog.LevelWarn, "idempotency handler failed after it was told to stop; its answer is not stored, and the key is retryable once its lock is stale", cl)
}

func (m *Middleware) release(ctx context.Context, cl *claimed, after string) {
	cl.hb.stop()
	// Bounded as a Complete is: a key not released goes stale, and is
	// retryable then, which is better than a request that never ends.
	ctx, cancel := context.WithTimeout(ctx, m.storeCallBound())
	defer cancel()
	if err := m.cfg.Store.Release(ctx, cl.scope, cl.key, cl.token); err != nil {
		m.logKey(ctx, slog.LevelError, "idempotency key not released after "+after+"; it is retryable once its lock is stale", cl, slog.Any("error", err))
	}
}

// storeResult says what became of a response the middleware stores.
type storeResult int

const (
	stored   storeResult = iota + 1
	lockLost             // another request took the key over: not stored, never will be
	storing              // not stored yet: the middleware keeps trying in the background
)

// completeRetryMin is the first wait before storing a response again.
const completeRetryMin = 50 * time.Millisecond

// completeBound is how long a request waits for one Complete before it is
// answered 409 and its response is stored in the background: LockTimeout/3,
// so that a Complete that hangs gives the heartbeat's op back before the
// watchdog's 2/3 of LockTimeout (see heartbeat.complete). The request's own
// context is not canceled when its client leaves (its retry needs the
// stored response), so without a bound a store call that never returns (a
// silent session: no answer, no reset) would hang the request for good,
// and, as a Complete holds op, stop the renewals too: the lock would go
// stale with the store reachable, and another request would run the
// handler again. The store call itself is given LockTimeout (storeCallBound)
// before its context ends.
func (m *Middleware) completeBound() time.Duration { return m.cfg.LockTimeout / 3 }

// storeCallBound bounds the context of one Complete or Release: a store
// that honours its context ends a call that hangs by then, and another try
// (storeLater's) draws another session.
func (m *Middleware) storeCallBound() time.Duration { return m.cfg.LockTimeout }

// store stores resp for a claimed key. When the store fails, the key stays
// held (its heartbeat keeps running) and a goroutine that Close owns keeps
// trying, with backoff from completeRetryMin up to RetryAfter, so that the
// client that comes back after Retry-After likely finds the response; it
// stops once the response is stored, the lock is lost, the entry expired,
// or Close.
func (m *Middleware) store(ctx context.Context, cl *claimed, resp *StoredResponse) storeResult {
	req := CompleteRequest{Scope: cl.scope, Key: cl.key, Token: cl.token, Response: resp, ExpiresAt: m.cfg.now().Add(m.cfg.Retention)}
	err := cl.hb.complete(ctx, req)
	switch {
	case err == nil:
		return stored
	case errors.Is(err, ErrLockLost):
		m.logKey(ctx, slog.LevelWarn, "idempotency lock lost while the handler ran; its response is not sent", cl)
		return lockLost
	}
	level := slog.LevelError
	if errors.Is(err, errCompletePending) {
		// Slow, not failed: the Complete goes on (see heartbeat.complete),
		// and storeLater waits for it.
		level = slog.LevelInfo
	}
	m.logKey(ctx, level, "idempotency response not stored yet; the key stays held and storing is retried", cl, slog.Any("error", err))
	if !m.spawn(func(life context.Context) { m.storeLater(life, cl, req) }) {
		cl.hb.stop()
		m.logKey(ctx, slog.LevelError, "idempotency response not stored: the middleware is closed; the key is retryable once its lock is stale", cl)
	}
	return storing
}

func (m *Middleware) storeLater(life context.Context, cl *claimed, req CompleteRequest) {
	defer cl.hb.stop()
	wait := completeRetryMin
	t := time.NewTimer(wait)
	defer t.Stop()
	for attempt := 2; ; attempt++ {
		select {
		case <-life.Done():
			m.logKey(life, slog.LevelError, "idempotency response not stored before Close; the key is retryable once its lock is stale", cl)
			return
		case <-t.C:
		}
		now := m.cfg.now()
		if !now.Before(cl.expiresAt) {
			m.logKey(life, slog.LevelError, "idempotency response not stored before its entry expired", cl)
			return
		}
		req.ExpiresAt = now.Add(m.cfg.Retention)
		err := cl.hb.complete(life, req) // bounded by completeBound
		switch {
		case err == nil:
			m.logKey(life, slog.LevelInfo, "idempotency response stored after a store failure", cl, slog.Int("attempts", attempt))
			return
		case errors.Is(err, ErrLockLost):
			m.logKey(life, slog.LevelWarn, "idempotency lock lost before the response could be stored", cl)
			return
		case life.Err() == nil:
			m.logKey(life, slog.LevelDebug, "idempotency response still not stored", cl, slog.Any("error", err))
		}
		wait = min(2*wait, max(m.cfg.RetryAfter, completeRetryMin))
		t.Reset(wait)
	}
}

// answerExisting answers a request whose key is held by an entry it could
// not claim.
func (m *Middleware) answerExisting(w http.ResponseWriter, r *http.Request, key, fp string, e *Entry) Outcome {
	switch {
	case e.Fingerprint != fp:
		m.problemKeyReused(w, r, key, e)
		return Outcome{Kind: OutcomeKeyReused, Key: key, Status: http.StatusUnprocessableEntity}
	case e.State == Completed && e.Response != nil:
		writeStored(w, e.Response, nil, true)
		return Outcome{Kind: OutcomeReplayed, Key: key, Status: e.Response.Status}
	default:
		m.problemInProgress(w, key, "")
		return Outcome{Kind: OutcomeInProgress, Key: key, Status: http.StatusConflict}
	}
}

// writeStored sends a stored response, with the Set-Cookie values of the
// first response only, and the replay mark on a replay. resp is the
// caller's own (a store keeps its own copy, and hands out copies): its
// header's values go to w as they are.
func writeStored(w http.ResponseWriter, resp *StoredResponse, cookies []string, replayed bool) {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
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
	m.logKey(ctx, level, msg, &claimed{scope: scope, key: key, method: r.Method, path: r.URL.Path}, attrs...)
}

func (m *Middleware) logKey(ctx context.Context, level slog.Level, msg string, cl *claimed, attrs ...slog.Attr) {
	if !m.cfg.Logger.Enabled(ctx, level) {
		return
	}
	attrs = append([]slog.Attr{
		slog.String("method", cl.method), slog.String("path", cl.path), slog.String("key_hash", wire.KeyHash(cl.scope, cl.key)),
	}, attrs...)
	m.cfg.Logger.LogAttrs(ctx, level, msg, attrs...)
}
