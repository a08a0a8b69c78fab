package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-cleanhttp"

	"github.com/idemkit/idem/internal/wire"
)

// Config configures a Client. Only Journal is required; every other field's
// zero value means its documented default.
type Config struct {
	// Journal records every operation before it is sent. Required: open one
	// with OpenSQLite. The client does not close it.
	Journal Journal

	// BaseURL resolves relative Op.URLs.
	BaseURL string
	// Scope is the scope of operations whose Op.Scope is empty. Defaults to
	// "default".
	Scope string

	// Status settles operations whose outcome is unknown. Defaults to
	// ReplayStatus(), which re-sends the same key and bytes; use
	// StatusEndpoint when the server has one.
	Status StatusChecker
	// Authorize adds credentials to every request, attempt and status check
	// alike, right before it is sent: a token fetched after a restart is
	// fresh, and no credential is ever journaled.
	Authorize func(*http.Request) error
	// HTTPClient supplies the transport (and cookie jar). Its Timeout and
	// CheckRedirect are not used: each attempt is bounded by AttemptTimeout
	// and redirects are never followed, so that a write is never silently
	// re-sent elsewhere. Defaults to a pooled transport.
	HTTPClient *http.Client

	// KeyHeader is the request header that carries the key. Defaults to
	// "Idempotency-Key".
	KeyHeader string
	// QuoteKey sends the key as an RFC 8941 sf-string ("…"), as the IETF
	// draft specifies, instead of a bare token, which Stripe and most
	// servers expect. The form never changes between attempts.
	QuoteKey bool
	// Keys chooses how keys are minted. Defaults to KeyRandom (UUIDv4).
	Keys KeyKind
	// KeyNamespace is the UUIDv5 namespace of KeyDeterministic. Defaults
	// to DefaultKeyNamespace.
	KeyNamespace uuid.UUID

	// Retry bounds the retries and status checks of one call.
	Retry RetryPolicy
	// Classify decides what each attempt's result means. Defaults to
	// Classify.
	Classify Classifier
	// Retention is how long the server keeps a key. An operation that may
	// have reached the server and is still unsettled after Retention is
	// expired instead of re-sent. Set it no longer than the server's own
	// retention, minus clock skew. Defaults to 24 h.
	Retention time.Duration
	// AttemptTimeout bounds one attempt or status check, including reading
	// the body. It must outlast the server's processing time. Defaults to
	// 30 s.
	AttemptTimeout time.Duration
	// MaxResponseBytes is how much of a response body is read and
	// journaled. A longer body is cut, and the cut is noted in the
	// journal. Defaults to 4 MiB.
	MaxResponseBytes int64
	// SecretHeaders lists more headers, besides Authorization,
	// Proxy-Authorization and Cookie, that Op.Header may not carry and
	// that are never journaled from responses (Set-Cookie never is).
	SecretHeaders []string

	// LeaseDuration is how long a worker's claim on an operation lasts
	// without renewal. The client renews its leases every third of it, so
	// an operation whose process died is taken over within LeaseDuration.
	// Defaults to 15 s.
	LeaseDuration time.Duration
	// Owner names this client in leases and the journal's history.
	// Defaults to host/pid/random.
	Owner string
	// ResumeConcurrency is how many operations Resume drives at once.
	// Defaults to 8.
	ResumeConcurrency int
	// CommitOutcomes makes Do commit a success before it returns. By
	// default a success is buffered: Do returns before its commit, which
	// the next journal write makes (usually the next operation's intent,
	// so that both share one fsync), and a crash of the process in between
	// leaves the record in_flight, for Resume to settle with a status check
	// while the server still keeps the key (Retention); after that it
	// expires, for an operator. Set it where a crash must not depend on
	// that: each operation then costs a second commit, without fsync. A
	// rejection is always on disk before Do returns.
	CommitOutcomes bool
	// ResumeInterval, when positive, makes the client run Resume in the
	// background every ResumeInterval, from New until Close, so that
	// operations a call left unsettled (the server was down, the outcome
	// unknown) and those a crashed process left behind are finished without
	// the application calling Resume. Its reports go to OnResumeProgress
	// and the logger. Zero (the default) leaves Resume to the application.
	ResumeInterval time.Duration

	// Logger receives the client's logs: no bodies, no header values, no
	// secrets. Defaults to discarding them.
	Logger *slog.Logger
	// OnTransition is called after every journaled state change, for
	// metrics and tracing, on the goroutine that made the change: it may be
	// called concurrently (Resume drives several operations at once), and
	// it delays the call it reports on, so keep it fast.
	OnTransition func(Transition)
	// OnResumeProgress is called by Resume after each operation it
	// finished, with the counts so far.
	OnResumeProgress func(ResumeReport)
}

// Transition is a journaled state change, as OnTransition sees it.
type Transition struct {
	Key, Scope, ID string
	// From is zero (it prints as "none") when the record was just created.
	From, To State
	Attempt  int
	// StatusCode is the HTTP status that caused the change, if any.
	StatusCode int
	// Reason says why, as journaled in Record.LastError.
	Reason string
	At     time.Time
}

// Client drives operations through the journal. It is safe for concurrent
// use; create one per journal and reuse it.
type Client struct {
	cfg       Config
	journal   Journal
	base      *url.URL
	keyHeader string
	secrets   []string
	http      *http.Client
	status    StatusChecker
	classify  Classifier
	retry     RetryPolicy
	budget    *retryBudget
	log       *slog.Logger
	now       func() time.Time

	// ctx is canceled by Close; every call's context is tied to it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // calls in progress and the lease renewer

	mu      sync.Mutex
	closed  bool
	flights map[scopeID]*flight
	leases  int // operations this client is driving, so holding leases
}

// New checks cfg and returns a client. It starts one goroutine, which
// renews the client's leases; Close stops it.
func New(cfg Config) (*Client, error) {
	if cfg.Journal == nil {
		return nil, fmt.Errorf("%w: Config.Journal is nil; open one with idem.OpenSQLite", ErrInvalidConfig)
	}
	c := &Client{cfg: cfg, journal: cfg.Journal, flights: map[scopeID]*flight{}}
	if cfg.BaseURL != "" {
		u, err := url.Parse(cfg.BaseURL)
		if err != nil || !u.IsAbs() || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("%w: Config.BaseURL %q must be an absolute http or https URL", ErrInvalidConfig, cfg.BaseURL)
		}
		if u.User != nil {
			return nil, fmt.Errorf("%w: Config.BaseURL carries user credentials; add them in Config.Authorize", ErrInvalidConfig)
		}
		c.base = u
	}
	if c.cfg.Scope == "" {
		c.cfg.Scope = "default"
	}
	if err := checkName("Config.Scope", c.cfg.Scope, maxScopeLength, "use a tenant or namespace name"); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	c.keyHeader = http.CanonicalHeaderKey(cfg.KeyHeader)
	if c.keyHeader == "" {
		c.keyHeader = wire.KeyHeader
	}
	if cfg.Keys > KeyDeterministic {
		return nil, fmt.Errorf("%w: Config.Keys %d is not a KeyKind", ErrInvalidConfig, cfg.Keys)
	}
	if c.cfg.KeyNamespace == uuid.Nil {
		c.cfg.KeyNamespace = DefaultKeyNamespace
	}
	c.secrets = []string{"Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie"}
	for _, h := range cfg.SecretHeaders {
		c.secrets = append(c.secrets, http.CanonicalHeaderKey(h))
	}
	def := func(v *time.Duration, d time.Duration, name string) error {
		if *v < 0 {
			return fmt.Errorf("%w: Config.%s is negative", ErrInvalidConfig, name)
		}
		if *v == 0 {
			*v = d
		}
		return nil
	}
	if err := errors.Join(
		def(&c.cfg.Retention, 24*time.Hour, "Retention"),
		def(&c.cfg.AttemptTimeout, 30*time.Second, "AttemptTimeout"),
		def(&c.cfg.LeaseDuration, 15*time.Second, "LeaseDuration"),
		def(&c.cfg.ResumeInterval, 0, "ResumeInterval"),
	); err != nil {
		return nil, err
	}
	if c.cfg.MaxResponseBytes <= 0 {
		c.cfg.MaxResponseBytes = 4 << 20
	}
	if c.cfg.ResumeConcurrency <= 0 {
		c.cfg.ResumeConcurrency = 8
	}
	if c.cfg.Owner == "" {
		host, _ := os.Hostname()
		c.cfg.Owner = fmt.Sprintf("%s/%d/%s", host, os.Getpid(), uuid.NewString()[:8])
	}
	c.now = time.Now
	c.retry = cfg.Retry.withDefaults()
	c.budget = newRetryBudget(c.retry, c.now)
	c.classify = cfg.Classify
	if c.classify == nil {
		c.classify = Classify
	}
	c.status = cfg.Status
	if c.status == nil {
		c.status = ReplayStatus()
	}
	c.log = cfg.Logger
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.http = c.newHTTPClient()
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.wg.Add(1)
	go c.renewLeases()
	if c.cfg.ResumeInterval > 0 {
		c.wg.Add(1)
		go c.resumeEvery(c.cfg.ResumeInterval)
	}
	return c, nil
}

func (c *Client) newHTTPClient() *http.Client {
	var base http.RoundTripper
	var jar http.CookieJar
	if c.cfg.HTTPClient != nil {
		base, jar = c.cfg.HTTPClient.Transport, c.cfg.HTTPClient.Jar
	}
	if base == nil {
		t := cleanhttp.DefaultPooledTransport()
		// Many operations go to one API host: keep their connections.
		t.MaxIdleConnsPerHost = 256
		base = t
	}
	return &http.Client{
		Transport: authorizing{base: base, authorize: c.cfg.Authorize},
		Jar:       jar,
		Timeout:   c.cfg.AttemptTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// authorizing runs Authorize on a copy of each request right before it is
// sent, so credentials reach the wire and nothing else.
type authorizing struct {
	base      http.RoundTripper
	authorize func(*http.Request) error
}

func (a authorizing) RoundTrip(req *http.Request) (*http.Response, error) {
	if a.authorize == nil {
		return a.base.RoundTrip(req)
	}
	r := req.Clone(req.Context())
	if err := a.authorize(r); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("idem: Config.Authorize: %w", err)
	}
	return a.base.RoundTrip(r)
}

func (c *Client) secretHeader(canon string) bool { return slices.Contains(c.secrets, canon) }

// Close interrupts the calls in progress (their operations stay journaled,
// and Resume finishes them), waits for them to return and stops the lease
// renewer. It does not close the journal.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	c.http.CloseIdleConnections()
	return nil
}

// enter registers a call in progress and ties ctx to the client's life:
// Close cancels it and waits for the call to return.
func (c *Client) enter(ctx context.Context) (context.Context, func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, nil, ErrClientClosed
	}
	c.wg.Add(1)
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.ctx, cancel)
	return ctx, func() { stop(); cancel(); c.wg.Done() }, nil
}

// Do runs op to a definitive answer: it journals the operation with its key
// before sending, sends it, retries with the same key, and checks the
// server's status when the outcome is unknown.
//
// err is nil exactly when the answer is definitive: res.State is
// StateSucceeded or StateRejected, with the server's status, headers and
// body. Otherwise err says what is known: an *OperationError matching
// ErrOutcomeUnknown or ErrNotSent (the operation is journaled and Resume,
// or another Do, finishes it), ErrNeedsReconciliation, or ErrKeyConflict;
// ErrFingerprintMismatch when op.ID was journaled with another request;
// ErrInvalidOp, ErrBodyTooLarge or a journal error, in which case nothing
// was sent.
//
// Calling Do again with the same scope and ID reuses the key and, once the
// operation is settled, returns the journaled result without sending. Calls
// for one operation, from many goroutines or processes sharing the journal,
// put at most one attempt on the wire at a time and return the same result.
//
// The happy path costs one durable journal write: the record is created
// directly as in_flight, and the outcome is recorded without waiting for
// its fsync (see Journal.Update).
func (c *Client) Do(ctx context.Context, op Op) (*Result, error) {
	p, err := c.prepare(op)
	if err != nil {
		return nil, err
	}
	return c.run(ctx, p.scope, p.id, func(ctx context.Context) (*Result, error) {
		key, err := c.mintKey(p.scope, p.id)
		if err != nil {
			return nil, err
		}
		now := c.now()
		rec := p.record(key)
		rec.State = StateInFlight
		rec.Attempts = 1
		rec.ExpiresAt = now.Add(c.cfg.Retention)
		rec.Lease = Lease{Owner: c.cfg.Owner, ExpiresAt: now.Add(c.cfg.LeaseDuration)}
		stored, created, err := c.journal.Create(ctx, rec)
		if err != nil {
			return nil, err
		}
		if !created {
			return c.continueExisting(ctx, stored)
		}
		c.transition(Record{}, stored)
		d := c.newDriver(stored)
		d.sendNow, d.maybeApplied = true, false // in_flight, but not yet sent
		return d.run(ctx)
	})
}

// Begin journals op as pending and returns its handle without sending it,
// so that the application can store op.Key() first. Send sends it. Calling
// Begin again with the same scope and ID returns the same operation; a
// different request under that ID gives ErrFingerprintMismatch.
func (c *Client) Begin(ctx context.Context, op Op) (*Operation, error) {
	p, err := c.prepare(op)
	if err != nil {
		return nil, err
	}
	ctx, done, err := c.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	key, err := c.mintKey(p.scope, p.id)
	if err != nil {
		return nil, err
	}
	rec := p.record(key)
	rec.State = StatePending
	stored, created, err := c.journal.Create(ctx, rec)
	if err != nil {
		return nil, err
	}
	if created {
		c.transition(Record{}, stored)
	}
	return &Operation{c: c, key: stored.Key, scope: stored.Scope, id: stored.ID}, nil
}

// Lookup returns what the journal holds for (scope, id); an empty scope
// means Config.Scope. It returns ErrNotFound when nothing is journaled.
func (c *Client) Lookup(ctx context.Context, scope, id string) (Record, error) {
	ctx, done, err := c.enter(ctx)
	if err != nil {
		return Record{}, err
	}
	defer done()
	if scope == "" {
		scope = c.cfg.Scope
	}
	return c.journal.Lookup(ctx, scope, id)
}

// Reconcile records an operator's decision about an operation whose
// outcome could not be confirmed (unknown or expired), after checking the
// business records: state is StateSucceeded or StateRejected, and note
// says why ("matched order 9812 in the ERP"). Nothing is sent.
func (c *Client) Reconcile(ctx context.Context, key string, state State, note string) error {
	if state != StateSucceeded && state != StateRejected {
		return fmt.Errorf("%w: an operation is reconciled as succeeded or rejected, not %s", ErrIllegalTransition, state)
	}
	if note == "" {
		return fmt.Errorf("%w: Reconcile needs a note saying what the decision is based on", ErrInvalidOp)
	}
	return c.settle(ctx, key, func(rec *Record) error {
		if rec.State != StateUnknown && rec.State != StateExpired {
			return fmt.Errorf("%w: operation %s is %s; only unknown or expired operations are reconciled", ErrIllegalTransition, key, rec.State)
		}
		rec.State = state
		rec.Note = note
		rec.LastError = "reconciled by an operator"
		return nil
	})
}

// Cancel withdraws a pending operation that was never sent; it ends
// canceled and is never sent. An operation that may have reached the server
// cannot be canceled: Reconcile it instead.
func (c *Client) Cancel(ctx context.Context, key string) error {
	return c.settle(ctx, key, func(rec *Record) error {
		if rec.State != StatePending {
			return fmt.Errorf("%w: operation %s is %s; only a pending operation that was never sent can be canceled", ErrIllegalTransition, key, rec.State)
		}
		rec.State = StateCanceled
		rec.LastError = "canceled"
		return nil
	})
}

// settle applies an operator's change with a durable compare-and-swap,
// re-reading on a concurrent change.
func (c *Client) settle(ctx context.Context, key string, change func(*Record) error) error {
	ctx, done, err := c.enter(ctx)
	if err != nil {
		return err
	}
	defer done()
	for {
		rec, err := c.journal.Get(ctx, key)
		if err != nil {
			return err
		}
		next := rec
		if err := change(&next); err != nil {
			return err
		}
		// An operator's write holds no lease: the journal refuses it with
		// ErrLeased while a live worker drives the operation.
		next.Lease = Lease{}
		stored, err := c.journal.Update(ctx, next, Durable)
		if errors.Is(err, ErrConflict) {
			continue
		}
		if err != nil {
			return err
		}
		c.transition(rec, stored)
		return nil
	}
}

// transition reports a journaled change to the hook and the log.
func (c *Client) transition(from, to Record) {
	code := 0
	if to.Response != nil {
		code = to.Response.StatusCode
	}
	c.log.Debug("idem: transition", "key", to.Key, "scope", to.Scope, "id", to.ID,
		"from", from.State.String(), "to", to.State.String(), "attempt", to.Attempts, "status", code)
	if c.cfg.OnTransition != nil && from.State != to.State {
		c.cfg.OnTransition(Transition{Key: to.Key, Scope: to.Scope, ID: to.ID, From: from.State, To: to.State,
			Attempt: to.Attempts, StatusCode: code, Reason: to.LastError, At: to.UpdatedAt})
	}
}

// flight is one operation being driven by this process; other callers for
// the same operation wait for it instead of racing it.
type flight struct {
	done chan struct{}
	res  *Result
	err  error
}

// startFlight registers this call as the one driving op in this process,
// or returns the flight already doing so.
func (c *Client) startFlight(op scopeID) (f *flight, leader bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, running := c.flights[op]; running {
		return f, false
	}
	f = &flight{done: make(chan struct{})}
	c.flights[op] = f
	c.leases++
	return f, true
}

func (c *Client) endFlight(op scopeID, f *flight) {
	c.mu.Lock()
	delete(c.flights, op)
	c.leases--
	c.mu.Unlock()
	close(f.done)
}

// run executes fn for (scope, id) unless another call in this process is
// already driving that operation, in which case it waits for that call and
// shares its answer. A follower whose leader was stopped by its own context
// runs fn itself.
func (c *Client) run(ctx context.Context, scope, id string, fn func(context.Context) (*Result, error)) (*Result, error) {
	ctx, done, err := c.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	op := scopeID{scope, id}
	for {
		f, leader := c.startFlight(op)
		if leader {
			defer c.endFlight(op, f)
			f.res, f.err = fn(ctx)
			return f.res, f.err
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if f.err != nil && (errors.Is(f.err, context.Canceled) || errors.Is(f.err, context.DeadlineExceeded)) && ctx.Err() == nil {
			continue // the leader gave up for its own reasons; try ourselves
		}
		return f.res, f.err
	}
}

// continueExisting drives an operation found in the journal: it returns a
// settled result at once, and otherwise takes the lease and drives it,
// waiting while another worker holds it.
func (c *Client) continueExisting(ctx context.Context, rec Record) (*Result, error) {
	wait := 0
	for {
		switch {
		case rec.State.Terminal() && rec.State != StateCanceled:
			res := resultFrom(rec)
			res.Journaled = true
			return res, nil
		case rec.State == StateCanceled, rec.State == StateExpired:
			return nil, opError(rec, nil)
		}
		acquired, err := c.journal.Acquire(ctx, rec.Key, c.cfg.Owner, c.cfg.LeaseDuration)
		if err == nil {
			return c.newDriver(acquired).run(ctx)
		}
		if !errors.Is(err, ErrLeased) && !errors.Is(err, ErrNotActive) {
			return nil, err
		}
		rec = acquired
		if errors.Is(err, ErrLeased) {
			// Another process drives it: poll until it settles or its lease
			// frees (it renews while alive, so a dead one frees it soon).
			wait++
			d := min(c.retry.MinBackoff<<min(wait, 6), time.Second)
			if err := sleep(ctx, d); err != nil {
				return nil, opError(rec, err)
			}
			if rec, err = c.journal.Get(ctx, rec.Key); err != nil {
				return nil, err
			}
		}
	}
}

// renewLeases keeps the leases of the operations this client drives alive,
// so a lease only expires when its process is gone.
func (c *Client) renewLeases() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.LeaseDuration / 3)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		busy := c.leases > 0
		c.mu.Unlock()
		if !busy {
			continue
		}
		if _, err := c.journal.Renew(c.ctx, c.cfg.Owner, c.cfg.LeaseDuration); err != nil && c.ctx.Err() == nil {
			c.log.Warn("idem: renewing leases failed", "owner", c.cfg.Owner, "error", err)
		}
	}
}

// resumeEvery runs Resume every interval until Close (Config.ResumeInterval).
func (c *Client) resumeEvery(interval time.Duration) {
	defer c.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		rep, err := c.Resume(c.ctx)
		switch {
		case c.ctx.Err() != nil:
			return
		case err != nil:
			c.log.Warn("idem: background resume failed", "error", err)
		case rep.Claimed > 0:
			c.log.Info("idem: background resume", "claimed", rep.Claimed, "succeeded", rep.Succeeded,
				"rejected", rep.Rejected, "pending", rep.Pending, "unknown", rep.Unknown, "expired", rep.Expired)
		}
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func opError(rec Record, cause error) *OperationError {
	e := &OperationError{Key: rec.Key, Scope: rec.Scope, ID: rec.ID, State: rec.State, Attempts: rec.Attempts, Err: cause}
	if rec.Response != nil {
		e.StatusCode = rec.Response.StatusCode
	}
	if cause == nil && rec.LastError != "" && !rec.State.Terminal() {
		e.Err = errors.New(rec.LastError)
	}
	return e
}
