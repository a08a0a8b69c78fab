package idem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-cleanhttp"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idem/internal/wire"
)

// Config configures a Client. Only Journal is required; every other field's
// zero value means its documented default.
type Config struct {
	// Journal records every operation before it is sent. Required; the
	// client does not close it. One of:
	//   - OpenSQLite: a file on this machine, the default;
	//   - postgres.OpenJournal (module github.com/idemkit/idem/postgres):
	//     shared by a fleet of workers, each resuming the others';
	//   - NewMemoryJournal: for tests; a restart forgets every operation.
	Journal Journal

	// BaseURL resolves relative Op.URLs. When it is set, every operation
	// goes to its origin (an absolute Op.URL of another is refused), and
	// Resume takes up the operations of that origin.
	BaseURL string
	// Scope is the scope of operations whose Op.Scope is empty: the tenant
	// this client acts for. Defaults to "default". It is journaled and
	// shown as it is (idem ls, idem ui, the otel module's
	// idem.operation.scope): a tenant's name, never a credential, which
	// belongs in Authorize.
	Scope string
	// ResumeScopes are the scopes Resume (and background resume) drives,
	// for a client that serves several tenants (its Authorize choosing
	// credentials per operation with OperationFrom). Defaults to
	// []string{Scope}: a client resumes only its own tenant's operations,
	// because its credentials belong to that tenant. The option
	// ResumeAllScopes takes every scope, for an operator.
	ResumeScopes []string

	// Status settles operations whose outcome is unknown. Defaults to
	// ReplayStatus(), which re-sends the same key and bytes; use
	// StatusEndpoint when the server has one.
	Status StatusChecker
	// Authorize adds credentials to every request, attempt and status check
	// alike, right before it is sent: a token fetched after a restart is
	// fresh, and no credential is ever journaled. OperationFrom tells it
	// which operation (scope, ID, key) the request is for, so it can choose
	// credentials per tenant.
	//
	// It runs for each request the client sends, and no other: before a
	// retry, a status check's replay or a Resume's send is journaled,
	// right after Do journals a new operation with its first attempt, and
	// on a redirect an attempt follows. When it returns an error the
	// request is not sent, and that is no attempt: nothing is journaled for
	// it (the first attempt Do journaled is reused by the next send), and
	// the call
	// stops at once with an error matching ErrAuthorizeFailed and
	// Authorize's own error, the operation staying pending (unknown if an
	// earlier attempt may have reached the server). Nothing tries it again
	// within the call; the next Do of the operation, or a Resume (the
	// background one included) once it is due, after RetryPolicy.MaxBackoff,
	// runs Authorize again.
	//
	// What is sent is the journaled request with Authorize's headers, URL
	// and Host. It may read the body, to sign it: it is given the
	// journaled bytes, and must leave those bytes in Body: one that changes
	// the body (compresses, encrypts), or sets or removes the key's header
	// (KeyHeader), fails as if it returned an error.
	// Its request's context ends at AttemptTimeout.
	Authorize func(*http.Request) error
	// HTTPClient supplies the transport (and cookie jar). Its Timeout and
	// CheckRedirect are not used: each attempt is bounded by AttemptTimeout,
	// and a redirect is followed only when it keeps the method and body
	// (307, 308) and stays on the request's origin, with the same key and
	// Authorize run again, so that a write and its credentials never go
	// elsewhere; any other redirect is the answer. Defaults to a pooled
	// transport.
	HTTPClient *http.Client

	// KeyHeader is the request header that carries the key of operations
	// this client creates. Defaults to "Idempotency-Key".
	KeyHeader string
	// QuoteKey sends the key of operations this client creates as an RFC
	// 8941 sf-string ("…"), as the IETF draft specifies, instead of a bare
	// token, which Stripe and most servers expect.
	//
	// KeyHeader and QuoteKey are journaled with each operation: every later
	// attempt, replay and status check of that operation uses its journaled
	// form, whichever client, process or tool sends it.
	QuoteKey bool
	// Keys chooses how keys are minted. Defaults to KeyRandom (UUIDv4).
	Keys KeyKind
	// KeyNamespace is the UUIDv5 namespace of KeyDeterministic, required
	// with it: generate one with uuid.New() for the application, and keep
	// it like a credential. Anyone who knows it can compute the
	// application's keys from scopes and operation IDs, and against a
	// server that scopes keys by key alone, read or pre-empt its stored
	// answers.
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
	//
	// Every duration of Config and RetryPolicy is a time.Duration, counted
	// in nanoseconds: New refuses a negative one, and a positive one below
	// 1 ms (LeaseDuration: below 100 ms) as a unit mistake (Retention: 24
	// is 24 ns), with ErrInvalidConfig naming the field.
	Retention time.Duration
	// AttemptTimeout bounds one attempt or status check, including reading
	// the body (a followed redirect is a new request, with a bound of its
	// own). It must outlast the server's processing time. Defaults to 30 s;
	// at least 1 ms.
	AttemptTimeout time.Duration
	// MaxResponseBytes is how much of a response body is read and
	// journaled. A longer body is cut, and the cut is noted in the
	// journal and in Result.BodyCut (the standard client's body then ends
	// with io.ErrUnexpectedEOF). Defaults to 4 MiB.
	MaxResponseBytes int64
	// SecretHeaders lists more headers, besides Authorization,
	// Proxy-Authorization, Cookie, X-Api-Key, X-Auth-Token and Api-Key
	// (where API gateways and SDKs, Anthropic's among them, send their
	// keys), that Op.Header may not carry, that the standard client sends
	// for its call only and never journals, and that are never journaled
	// from responses (Set-Cookie never is). A
	// stored response's header names are canonical: a secret header is
	// dropped whatever case the answer (an attempt's or a status
	// checker's) spells its name in. New refuses an entry that is not a
	// header name (ErrInvalidConfig), such as one with a space around it.
	SecretHeaders []string

	// LeaseDuration is how long a worker's claim on an operation lasts
	// without renewal. The client renews its leases every third of it,
	// and tries a failed renewal again within a thirtieth of it (a second
	// at most), so that a journal that fails now and then does not cost a
	// live worker its operations.
	// When its process dies, a journal that can see it (SQLite: every
	// process sharing the file is on one machine) lets another take its
	// operations at once; one that cannot (a journal shared by machines)
	// lets them be taken when the lease lapses. Defaults to 15 s; at least
	// 100 ms, as a renewal is a journal write every third of it.
	LeaseDuration time.Duration
	// Owner names this client in leases and the journal's history; the
	// client adds "#" and a random suffix, so that a process restarted
	// under the same name is a new owner and never mistakes the dead
	// one's leases for its own. Defaults to host/pid.
	Owner string
	// ResumeConcurrency is how many operations Resume drives at once.
	// Defaults to 8.
	ResumeConcurrency int
	// ResumeInterval, when positive, makes the client run Resume in the
	// background every ResumeInterval, from New until Close or Shutdown,
	// so that
	// operations a call left unsettled (the server was down, the outcome
	// unknown) and those a crashed process left behind are finished without
	// the application calling Resume. Its reports go to OnResumeProgress
	// and the logger. A pass whose slow operations outlast an interval
	// claims again every interval with its free slots, so that an
	// operation whose owner died, or one that became due, waits for no
	// slow one. Zero (the default) leaves Resume to the application;
	// negative is refused, and so is a positive interval below 1 ms.
	ResumeInterval time.Duration

	// Logger receives the client's logs: no bodies, no header values, no
	// secrets. Each Resume pass is one line, at Info when it claimed or
	// expired something and at Debug when it found nothing to do.
	// Defaults to discarding them.
	//
	// A URL in a transport's error (net/http's "Post \"…\": EOF") is
	// without its query and userinfo, which may carry a token: so in the
	// logs, and likewise in the reasons the journal's history keeps
	// (LastError, each event's detail, Transition), Hooks and the error Do
	// returns, all of which are read or logged where a token has no place.
	// The journaled request keeps the whole URL, as it sends it again.
	Logger *slog.Logger
	// OnTransition is called after every journaled state change, for
	// metrics and tracing, on the goroutine that made the change: it may be
	// called concurrently (Resume drives several operations at once), and
	// it delays the call it reports on, so keep it fast.
	OnTransition func(Transition)
	// Hooks observe each call, attempt and status check, for tracing and
	// metrics; see Hooks.
	Hooks Hooks
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
	// Kind and Detail are the history event's (see Event).
	Kind   EventKind
	Detail string
	At     time.Time
}

// Client drives operations through the journal. It is safe for concurrent
// use; create one per journal and tenant, reuse it, and Close (or Shutdown)
// it before the process exits, so that nothing it buffered is lost.
type Client struct {
	cfg     Config
	journal Journal
	// base is Config.BaseURL with its origin in its canonical spelling
	// (canonicalOrigin), which Do journals and sends and Resume looks
	// for; configured is Config.BaseURL as it spells it, which builds
	// before that journaled.
	base, configured *url.URL

	lastURL   atomic.Pointer[resolvedURL] // see resolve
	keyHeader string
	secrets   []string
	owner     string                // the lease owner: Config.Owner and a unique suffix
	http      *http.Client          // the client's transport, closed by Close
	attempts  *http.Client          // the same, for attempts and status checks
	sender    *retryablehttp.Client // sends rounds of attempts (newSender)
	// traces: the transport is net/http's own, which traces every request
	// it is given (the attempts' are theirs, with their trace): an attempt
	// it failed without writing its headers was not written. Another
	// transport's attempt is known unwritten only when the trace saw it
	// (attempt.traced).
	traces     bool
	status     StatusChecker // Config.Status
	statusName string
	classify   Classifier
	retry      RetryPolicy
	budget     *retryBudget
	log        *slog.Logger
	now        func() time.Time
	unregister func() error // ends the owner's registration with the journal
	observed   bool         // Config.Hooks follow calls

	// bgCtx stops the lease renewer, last.
	bgCtx    context.Context
	cancelBG context.CancelFunc
	calls    sync.WaitGroup // calls in progress
	bg       sync.WaitGroup // the lease renewer and the background resumer
	closing  chan struct{}  // closed when Close or Shutdown begins
	// stopped is closed once, after Close or Shutdown began, the calls
	// have returned (their last journal writes done) and the background
	// goroutines have stopped; leftOwners once the client has left the
	// journal's owners, which it does only then (leaveOwners). unsynced
	// says that the first Close or Shutdown could not make the journal
	// durable after stopped: a Close that follows does it.
	stopped    chan struct{}
	leftOwners chan struct{}
	leaving    sync.Once
	unsynced   bool

	mu       sync.Mutex
	closed   bool
	shutdown chan struct{} // closed once Close or Shutdown has finished
	flights  map[scopeID]*flight
	held     map[string]Lease // leases of the operations this client drives, by key
	// left are the keys of operations a call of this client may have left
	// leased to it: the call ended on a journal error (a write whose answer
	// was lost). See adopt.
	left map[string]struct{}
	// cancels are the calls in progress, by the number enter gave them:
	// interrupt cancels them when they must stop (Close, or the end of
	// Shutdown's context). A map under mu, which enter takes anyway, costs
	// a call less than tying its context to one of the client's
	// (context.AfterFunc: two allocations, and a lock every call shares).
	cancels  map[uint64]context.CancelFunc
	lastCall uint64
}

// New checks cfg and returns a client. It starts one goroutine, which
// renews the client's leases; Close stops it.
func New(cfg Config) (*Client, error) {
	if cfg.Journal == nil {
		return nil, fmt.Errorf("%w: Config.Journal is nil; open one with idem.OpenSQLite", ErrInvalidConfig)
	}
	c := &Client{cfg: cfg, journal: cfg.Journal, flights: map[scopeID]*flight{}, held: map[string]Lease{}, left: map[string]struct{}{}, cancels: map[uint64]context.CancelFunc{},
		closing: make(chan struct{}), shutdown: make(chan struct{}), stopped: make(chan struct{}), leftOwners: make(chan struct{}), observed: cfg.Hooks.observed()}
	if cfg.BaseURL != "" {
		u, err := url.Parse(cfg.BaseURL)
		if err != nil || !u.IsAbs() || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("%w: Config.BaseURL %q must be an absolute http or https URL", ErrInvalidConfig, redactString(cfg.BaseURL))
		}
		if u.User != nil {
			return nil, fmt.Errorf("%w: Config.BaseURL carries user credentials; add them in Config.Authorize", ErrInvalidConfig)
		}
		c.base, c.configured = canonicalOrigin(u), u
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
	if !wire.IsToken(c.keyHeader) {
		return nil, fmt.Errorf("%w: Config.KeyHeader %q is not a valid header name", ErrInvalidConfig, cfg.KeyHeader)
	}
	if cfg.Keys > KeyDeterministic {
		return nil, fmt.Errorf("%w: Config.Keys %d is not a KeyKind", ErrInvalidConfig, cfg.Keys)
	}
	if err := checkKeyNamespace(cfg.Keys, cfg.KeyNamespace); err != nil {
		return nil, err
	}
	if len(c.cfg.ResumeScopes) == 0 {
		c.cfg.ResumeScopes = []string{c.cfg.Scope}
	}
	for _, sc := range c.cfg.ResumeScopes {
		if err := checkName("Config.ResumeScopes", sc, maxScopeLength, "list tenant or namespace names"); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
		}
	}
	c.secrets = slices.Clone(defaultSecretHeaders)
	for i, h := range cfg.SecretHeaders {
		// An entry that is no header name matches no header, and the one
		// it was meant for (" X-Session-Token" from a configuration file)
		// would be journaled in clear: refused rather than trimmed, as
		// Op.Header's names are.
		if !wire.IsToken(h) {
			return nil, fmt.Errorf("%w: Config.SecretHeaders[%d] %q is not a valid header name (an HTTP token: no spaces, newlines or separators around or in it)", ErrInvalidConfig, i, h)
		}
		c.secrets = append(c.secrets, http.CanonicalHeaderKey(h))
	}
	if err := errors.Join(c.cfg.checkDurations(), c.cfg.checkNumbers()); err != nil {
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
		c.cfg.Owner = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	c.owner = c.cfg.Owner + "#" + uuid.NewString()[:8]
	c.now = time.Now
	c.retry = c.cfg.Retry.withDefaults()
	c.budget = newRetryBudget(c.retry, c.now)
	c.classify = cfg.Classify
	if c.classify == nil {
		c.classify = Classify
	}
	c.status = cfg.Status
	if c.status == nil {
		c.status = ReplayStatus()
	}
	if err := checkStatusConfig(c.status); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	c.statusName = statusCheckerName(c.status)
	c.log = cfg.Logger
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.http, c.attempts = c.newHTTPClients()
	c.sender = newSender(c.attempts)
	unregister, err := c.journal.Register(context.Background(), c.owner)
	if err != nil {
		return nil, fmt.Errorf("idem: registering this client with the journal: %w", err)
	}
	c.unregister = unregister
	c.bgCtx, c.cancelBG = context.WithCancel(context.Background())
	c.bg.Add(1)
	go c.renewLeases()
	if c.cfg.ResumeInterval > 0 {
		c.bg.Add(1)
		go c.resumeEvery(c.cfg.ResumeInterval)
	}
	return c, nil
}

// defaultSecretHeaders are the headers that carry credentials whatever
// Config.SecretHeaders says: the standard ones, and those API gateways and
// SDKs send API keys in.
var defaultSecretHeaders = []string{"Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie", "X-Api-Key", "X-Auth-Token", "Api-Key"}

// Owner returns the name under which this client holds leases: Config.Owner
// and a suffix of its own.
func (c *Client) Owner() string { return c.owner }

// newHTTPClients returns the client's HTTP client, whose
// CloseIdleConnections Close calls, and the same for attempts: without
// CloseIdleConnections, which go-retryablehttp calls after every round
// that ends in an error and which would empty the pool every other
// operation shares.
func (c *Client) newHTTPClients() (*http.Client, *http.Client) {
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
	_, c.traces = base.(*http.Transport)
	own := &http.Client{
		Transport: authorizing{base: base, authorize: c.cfg.Authorize, propagate: c.cfg.Hooks.Propagate,
			timeout: c.cfg.AttemptTimeout},
		Jar:           jar,
		CheckRedirect: sameOriginRedirect,
	}
	attempts := *own
	attempts.Transport = keepIdle{own.Transport}
	return own, &attempts
}

// sameOriginRedirect follows a 307 or 308, which keep the method and the
// body, when it stays on the first request's origin (scheme, host and
// port, in any spelling RFC 6454 calls the same, as for Op.URL), at most
// 5 times; net/http then sends the same headers, the key
// among them, and the transport runs Authorize again. Anything else is
// returned as the answer.
func sameOriginRedirect(req *http.Request, via []*http.Request) error {
	first := via[0].URL
	switch {
	case req.Response == nil,
		req.Response.StatusCode != http.StatusTemporaryRedirect && req.Response.StatusCode != http.StatusPermanentRedirect,
		len(via) > 5,
		!sameOrigin(req.URL, first):
		return http.ErrUseLastResponse
	}
	return nil
}

// authorizing bounds each request by AttemptTimeout and runs Authorize on
// a copy of it right before it is sent, so credentials reach the wire and
// nothing else.
//
// The bound is a deadline on the request's context, lifted when the body
// is closed, rather than http.Client.Timeout: net/http keeps a goroutine,
// a timer and a channel per request for a Timeout over a transport it does
// not know, and this one wraps the application's.
type authorizing struct {
	base      http.RoundTripper
	authorize func(*http.Request) error
	propagate func(context.Context, http.Header)
	timeout   time.Duration
}

func (a authorizing) RoundTrip(req *http.Request) (*http.Response, error) {
	if dl, ok := req.Context().Deadline(); ok && time.Until(dl) <= a.timeout {
		// The caller's deadline comes first and bounds the attempt:
		// context.WithTimeout would add a layer of cancellation and no
		// timer, and its ending would be the caller's, not AttemptTimeout
		// (timedOut). Without the layer, net/http registers the request's
		// cancellation once instead of twice.
		return a.send(req.Context(), req)
	}
	ctx, cancel := context.WithTimeout(req.Context(), a.timeout)
	resp, err := a.send(ctx, req)
	if err != nil {
		if timedOut(ctx, req.Context()) {
			err = attemptTimeout{a.timeout, err}
		}
		cancel()
		return nil, err
	}
	resp.Body = &deadlineBody{ReadCloser: resp.Body, ctx: ctx, outer: req.Context(), cancel: cancel, timeout: a.timeout}
	return resp, nil
}

func (a authorizing) send(ctx context.Context, req *http.Request) (*http.Response, error) {
	creds := credentialsOf(ctx)
	if a.authorize == nil && a.propagate == nil && creds == nil {
		if ctx.Err() != nil {
			return nil, notCalled(ctx, req)
		}
		if ctx == req.Context() {
			return a.base.RoundTrip(req)
		}
		return a.base.RoundTrip(req.WithContext(ctx))
	}
	r := req.Clone(ctx)
	p := preauthorized(req)
	if p != nil {
		// Authorize ran before the attempt was journaled: send what it
		// made of the request (its headers, its URL), as it is now.
		r.Header, r.URL, r.Host = p.Header.Clone(), p.URL, p.Host
	}
	if a.propagate != nil {
		propagate(ctx, a.propagate, r.Header)
	}
	if a.authorize != nil && p == nil {
		ar := r.WithContext(untraced{ctx})
		if err := a.authorize(ar); err != nil {
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, &authorizeError{err}
		}
		r = ar.WithContext(ctx)
	}
	// The credentials the request gave the RoundTripper for this call
	// override Authorize's, under whatever spelling it wrote them: they
	// are in the call's context, never in the journal, and go to the
	// request's origin only (a status endpoint elsewhere has Authorize's).
	if cr := creds.forURL(r.URL); len(cr) > 0 {
		withCredentials(r.Header, cr)
	}
	if ctx.Err() != nil {
		// Authorize or Propagate may have taken the time that ended it.
		return nil, notCalled(ctx, req)
	}
	return a.base.RoundTrip(r)
}

// notCalled is the error of an attempt whose context had ended before the
// transport was called, so that it was not: nothing was sent, whatever the
// transport, though a transport not known to trace (Client.traces) never
// said so. net/http's own returns the same error without taking a
// connection, and so without calling the trace's GetConn, which a
// pass-through wrapper of it hands on: checked here, that attempt too is
// known not sent.
func notCalled(ctx context.Context, req *http.Request) error {
	if req.Body != nil {
		req.Body.Close() // a RoundTripper closes the body, even on an error
	}
	return transportNotCalled{context.Cause(ctx)}
}

type transportNotCalled struct{ err error }

func (e transportNotCalled) Error() string { return e.err.Error() }
func (e transportNotCalled) Unwrap() error { return e.err }

// propagate runs Hooks.Propagate for a request whose headers are h: it
// adds headers, and may not change those the request carries (the key's
// among them, under any spelling), or one operation would go out under
// several keys. What it writes under such a name is not sent.
func propagate(ctx context.Context, fn func(context.Context, http.Header), h http.Header) {
	added := make(http.Header, 2)
	fn(ctx, added)
	for name, values := range added {
		if carries(h, name) {
			continue
		}
		canon := http.CanonicalHeaderKey(name)
		h[canon] = append(h[canon], values...)
	}
}

// carries reports whether h has the header name under any spelling.
func carries(h http.Header, name string) bool {
	if _, ok := h[name]; ok {
		return true
	}
	canon := http.CanonicalHeaderKey(name)
	for n := range h {
		if n == canon || http.CanonicalHeaderKey(n) == canon {
			return true
		}
	}
	return false
}

// deadlineBody lifts a request's AttemptTimeout when its body is closed,
// and says so when the timeout cut the body off.
type deadlineBody struct {
	io.ReadCloser
	ctx, outer context.Context
	cancel     context.CancelFunc
	timeout    time.Duration
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF && timedOut(b.ctx, b.outer) {
		err = attemptTimeout{b.timeout, err}
	}
	return n, err
}

func (b *deadlineBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// timedOut reports whether ctx, a request's, ended at its AttemptTimeout
// rather than with outer, the caller's.
func timedOut(ctx, outer context.Context) bool {
	return ctx.Err() == context.DeadlineExceeded && outer.Err() == nil
}

// attemptTimeout is a request cut off by AttemptTimeout. It is a
// context.DeadlineExceeded, as a Client.Timeout is in net/http.
type attemptTimeout struct {
	after time.Duration
	err   error
}

func (e attemptTimeout) Error() string {
	return fmt.Sprintf("%v (no complete answer within AttemptTimeout, %s)", e.err, e.after)
}
func (e attemptTimeout) Unwrap() error   { return e.err }
func (e attemptTimeout) Timeout() bool   { return true }
func (e attemptTimeout) Is(t error) bool { return t == context.DeadlineExceeded }

// CloseIdleConnections closes the idle connections of the transport, so
// that Close leaves no connection (and no goroutine reading one) behind.
func (a authorizing) CloseIdleConnections() {
	if c, ok := a.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// keepIdle hides CloseIdleConnections from go-retryablehttp.
type keepIdle struct{ rt http.RoundTripper }

func (k keepIdle) RoundTrip(req *http.Request) (*http.Response, error) { return k.rt.RoundTrip(req) }

func (c *Client) secretHeader(canon string) bool { return slices.Contains(c.secrets, canon) }

// closeTimeout bounds what Close spends on the journal once it has
// interrupted the calls in progress: their last writes, making the
// client's writes durable and leaving the journal's owners.
const closeTimeout = 30 * time.Second

// Close interrupts the calls in progress (their operations stay
// journaled, and Resume finishes them), waits for them to return, stops the
// client's goroutines, makes every journal write the client made durable
// (Journal.Sync), leaves the journal's owners and closes idle connections.
// It does not close the journal. Close gives the journal at most 30 s for
// the calls' last writes, Sync and leaving the owners; it returns an error
// when the writes could not be made durable within them. A process that must stop sooner
// (or may wait longer) calls Shutdown with a context of its own. Shutdown
// lets calls in progress finish first. Close after a Shutdown whose
// context ended does, within its 30 s, what that Shutdown left: it waits
// for the calls it interrupted to return (their last writes done), makes
// the journal durable and leaves its owners; once it returned nil, the
// journal may be closed.
func (c *Client) Close() error {
	interrupt, cancel := context.WithCancel(context.Background())
	cancel()
	finish, cancelFinish := context.WithTimeout(context.Background(), closeTimeout)
	defer cancelFinish()
	_, err := c.stop(interrupt, finish)
	// The interruption (interrupt's Canceled) is Close's design, not a
	// failure; what went wrong with the journal is one.
	return err
}

// Shutdown stops the client gracefully: new calls fail with
// ErrClientClosed at once, calls in progress go on until they return or ctx
// ends (then they are interrupted, their operations stay journaled, and
// Shutdown returns ctx's error), the background resumer stops, and then,
// as in Close, the lease renewer stops, every write the client made is
// made durable (Journal.Sync), the client leaves the journal's owners, and
// idle connections are closed.
//
// Every step honours ctx: once it ends, Shutdown returns its error at once
// (joined to what could not be done: "making the journal durable" when
// Sync did not finish), whatever the journal's state, and a registration
// with the journal still being ended is left to end on its own (a process
// that exits ends it too). A caller that wants the client's writes
// durable gives a context long enough for the calls in progress and for
// one Sync (a few seconds on a healthy journal). A ctx that ends during
// the wait for the calls leaves no time for Sync: what was not made
// durable is what a crash could cost (below), and the caller may still
// call the journal's Sync itself under a context of its own. A call
// interrupted while it journals an answer it received goes on with that
// write after Shutdown returned, if it must: the answer is not dropped;
// the client leaves the journal's owners once the interrupted calls have
// returned, not while they may still write as the owner of their leases.
// A Close that follows waits for them (see Close).
//
// What a crash (as opposed to Close or Shutdown) can cost: nothing that
// Do or Send reported. A success is committed before it is returned; what
// a power cut may lose of it (it is fsynced with the next durable write)
// reads again as in_flight, so Resume asks the server, which answers with
// the same result as long as it keeps the key (Config.Retention). An
// intent is never lost: it is on disk before anything is sent.
func (c *Client) Shutdown(ctx context.Context) error {
	werr, ferr := c.stop(ctx, ctx)
	err := ferr
	if werr != nil && !errors.Is(err, werr) {
		err = errors.Join(werr, err)
	}
	// A journal that gave up on an ended ctx may not say why; the caller
	// learns it from ctx's error.
	if cerr := ctx.Err(); err != nil && cerr != nil && !errors.Is(err, cerr) {
		err = errors.Join(cerr, err)
	}
	return err
}

// stop stops the client: calls in progress are waited for until wait
// ends, then interrupted (waitErr is wait's error then); the journal's
// Sync and the leaving of its owners run under finish (finishErr says
// what of them failed, or that finish ended first). A stop after the
// first (Close after Shutdown) does what the first could not within its
// finish, under its own (stopAgain).
func (c *Client) stop(wait, finish context.Context) (waitErr, finishErr error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.stopAgain(wait, finish)
	}
	c.closed = true
	close(c.closing)
	c.mu.Unlock()
	defer close(c.shutdown)

	done := make(chan struct{})
	go func() { c.calls.Wait(); close(done) }()
	select {
	case <-done:
	case <-wait.Done():
		waitErr = wait.Err()
		c.interrupt()
	}
	// An interrupted call may still be journaling what already happened
	// (outcomeCtx), which no interruption stops: it is waited for until
	// finish ends, then left to end on its own, the lease renewer with it.
	go func() {
		<-done
		c.cancelBG()
		c.bg.Wait()
		close(c.stopped)
	}()
	select {
	case <-c.stopped:
	case <-finish.Done():
		c.unsynced = true
		c.log.Warn("idem: the shutdown's context ended before the calls it interrupted had returned; what they still journal goes on in the background, and the client leaves the journal's owners once they have returned (Close waits for them)", "owner", c.owner, "error", finish.Err())
		go func() { <-c.stopped; c.leaveOwners() }()
		if serr := c.journal.Sync(finish); serr != nil && !errors.Is(serr, ErrJournalClosed) {
			finishErr = fmt.Errorf("idem: making the journal durable: %w", serr)
		} else {
			finishErr = finish.Err()
		}
		c.http.CloseIdleConnections()
		return waitErr, finishErr
	}
	if serr := c.journal.Sync(finish); serr != nil && !errors.Is(serr, ErrJournalClosed) {
		c.unsynced = true
		finishErr = fmt.Errorf("idem: making the journal durable: %w", serr)
	}
	if err := c.awaitLeft(finish); err != nil && finishErr == nil {
		finishErr = err
	}
	c.http.CloseIdleConnections()
	return waitErr, finishErr
}

// stopAgain is a stop after the first, which may still be under way or
// may have returned when its finish ended before the calls it
// interrupted had (their last writes going on): it interrupts the calls
// if wait has ended, and waits until finish ends for them, for the
// first stop, for a Sync of what they wrote and for the leaving of the
// journal's owners.
func (c *Client) stopAgain(wait, finish context.Context) (waitErr, finishErr error) {
	if wait.Err() != nil {
		c.interrupt()
	}
	for _, ch := range []chan struct{}{c.stopped, c.shutdown} {
		if !closedChan(ch) { // done is done, whatever finish
			select {
			case <-ch:
			case <-finish.Done():
				return nil, finish.Err()
			}
		}
	}
	if !c.unsynced && closedChan(c.leftOwners) {
		return nil, nil
	}
	if c.unsynced {
		if serr := c.journal.Sync(finish); serr != nil && !errors.Is(serr, ErrJournalClosed) {
			finishErr = fmt.Errorf("idem: making the journal durable: %w", serr)
		}
	}
	if err := c.awaitLeft(finish); err != nil && finishErr == nil {
		finishErr = err
	}
	c.http.CloseIdleConnections()
	return nil, finishErr
}

// closedChan reports whether ch is closed, without waiting.
func closedChan(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// leaveOwners leaves the journal's owners, once, after stopped: a call that
// still journals under its lease does so as a live owner's.
func (c *Client) leaveOwners() {
	c.leaving.Do(func() {
		go func() {
			if err := c.unregister(); err != nil {
				c.log.Warn("idem: leaving the journal's owners", "owner", c.owner, "error", err)
			}
			close(c.leftOwners)
		}()
	})
}

// awaitLeft leaves the journal's owners and waits for it until finish
// ends (Unregister takes no context), leaving it to end on its own past
// that.
func (c *Client) awaitLeft(finish context.Context) error {
	c.leaveOwners()
	select {
	case <-c.leftOwners:
		return nil
	case <-finish.Done():
		c.log.Warn("idem: leaving the journal's owners: not done when the shutdown's context ended; it goes on in the background", "owner", c.owner, "error", finish.Err())
		return finish.Err()
	}
}

// enter registers a call in progress and ties ctx to the client's life:
// Close cancels it and waits for the call to return (exit).
func (c *Client) enter(ctx context.Context) (context.Context, callExit, error) {
	// Made before the lock, which every call takes several times: the
	// lock only registers it.
	ctx, cancel := context.WithCancel(ctx)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		cancel()
		return nil, callExit{}, ErrClientClosed
	}
	c.calls.Add(1)
	c.lastCall++
	id := c.lastCall
	c.cancels[id] = cancel
	c.mu.Unlock()
	return ctx, callExit{c, id, cancel}, nil
}

// callExit ends a call enter registered: a value, not a closure, so that
// it costs no allocation.
type callExit struct {
	c      *Client
	id     uint64
	cancel context.CancelFunc
}

func (e callExit) done() {
	e.c.mu.Lock()
	delete(e.c.cancels, e.id)
	e.c.mu.Unlock()
	e.cancel()
	e.c.calls.Done()
}

// interrupt cancels the calls in progress. Close and Shutdown call it once
// no call may start (closed).
func (c *Client) interrupt() {
	c.mu.Lock()
	cancels := slices.Collect(maps.Values(c.cancels))
	c.mu.Unlock()
	for _, cancel := range cancels {
		cancel()
	}
}

// hold records that this client drives the operation key under lease l, so
// that the renewer keeps l alive; unhold forgets it.
func (c *Client) hold(key string, l Lease) {
	if l.Owner == "" {
		return
	}
	c.mu.Lock()
	c.held[key] = l
	c.mu.Unlock()
}

// maxLeft bounds the keys a client remembers in left; past it, an
// arbitrary one is forgotten for each new one (its lease then lapses).
const maxLeft = 1024

// leave records that a call of this client ended on a journal error with
// the operation key perhaps leased to this client.
func (c *Client) leave(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.left[key]; !ok && len(c.left) >= maxLeft {
		for k := range c.left {
			delete(c.left, k)
			break
		}
	}
	c.left[key] = struct{}{}
}

// adopt records, as hold does, that a call of this client takes up the
// operation key under l, and reports whether it may: only a lease in this
// client's name that a call of this very client left behind (see leave),
// and that no call of it holds now. Another process under the same Owner
// name (a restart) is never taken for this one.
func (c *Client) adopt(key string, l Lease) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.adoptLocked(key, l)
}

// adoptUndriven is adopt for Resume, which drives no call's flight: it
// also leaves rec to a call of this client that is on its operation
// already. Such a call holds the flight from before its create until its
// driver ends, and, between its create's commit and its driver, it holds
// the lease without holding the key: adopting it then, and releasing it
// on finding the flight, would release the lease the call sends under.
func (c *Client) adoptUndriven(rec Record) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, running := c.flights[scopeID{rec.Scope, rec.ID}]; running {
		return false
	}
	return c.adoptLocked(rec.Key, rec.Lease)
}

// driving reports whether a call of this client is on the operation of
// rec.
func (c *Client) driving(rec Record) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, running := c.flights[scopeID{rec.Scope, rec.ID}]
	return running
}

func (c *Client) adoptLocked(key string, l Lease) bool {
	_, held := c.held[key]
	_, left := c.left[key]
	if held || !left || l.Owner != c.owner {
		return false
	}
	delete(c.left, key)
	c.held[key] = l
	return true
}

// leftBehind returns the keys calls of this client left behind (see
// leave), for Resume to take up the ones still under this client's lease.
func (c *Client) leftBehind() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]string, 0, len(c.left))
	for k := range c.left {
		keys = append(keys, k)
	}
	return keys
}

// forget drops key from those left behind: nothing of this client's is
// left to take up there.
func (c *Client) forget(key string) {
	c.mu.Lock()
	delete(c.left, key)
	c.mu.Unlock()
}

// holds reports whether a call of this client holds the operation key.
func (c *Client) holds(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, held := c.held[key]
	return held
}

func (c *Client) unhold(key string) {
	c.mu.Lock()
	delete(c.held, key)
	c.mu.Unlock()
}

// Do runs op to a definitive answer: it journals the operation with its key
// before sending, sends it, retries with the same key, and checks the
// server's status when the outcome is unknown.
//
// err is nil exactly when the operation succeeded: res.State is
// StateSucceeded, with the server's status, headers and body. A definitive
// refusal returns res (StateRejected, with the server's answer) and an
// *OperationError matching ErrRejected (and ErrKeyConflict when the server
// said the key was reused). Otherwise res is nil and err says what is
// known: an *OperationError matching ErrOutcomeUnknown or ErrNotSent (the
// operation is journaled and Resume, or another Do, finishes it),
// ErrNeedsReconciliation, ErrCanceled, or ErrFingerprintMismatch (op.ID is
// journaled with another request); ErrInvalidOp, ErrBodyTooLarge or a
// journal error, in which case nothing was sent. The package documentation
// has the whole table.
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
	return c.do(ctx, p)
}

// do is Do for a prepared operation.
func (c *Client) do(ctx context.Context, p prepared) (*Result, error) {
	call := Call{Kind: CallDo, Scope: p.scope, ID: p.id, Method: p.method, URL: p.url}
	return c.observe(ctx, call, func(ctx context.Context) (*Result, error) {
		return c.run(ctx, p.scope, p.id, p.fingerprint, func(ctx context.Context) (*Result, error) { return c.create(ctx, p) })
	})
}

// create journals a new operation in_flight, attempt 1, and drives it; or,
// when the operation is journaled already, drives that.
func (c *Client) create(ctx context.Context, p prepared) (*Result, error) {
	key, err := c.mintKey(p.scope, p.id)
	if err != nil {
		return nil, err
	}
	now := c.now()
	rec := p.record(key, c.newForm())
	rec.Link = c.link(ctx)
	rec.State = StateInFlight
	rec.Attempts = 1
	rec.ExpiresAt = now.Add(c.cfg.Retention)
	rec.Lease = Lease{Owner: c.owner, ExpiresAt: now.Add(c.cfg.LeaseDuration)}
	stored, created, err := c.createRecord(ctx, rec, p.ownHeader, p.ownBody)
	if err != nil && p.journaledAsGiven(stored.Fingerprint, err) {
		return c.continueExisting(ctx, stored)
	}
	if err != nil {
		if !errors.Is(err, ErrFingerprintMismatch) {
			// The create's answer may have been lost after it committed.
			c.leave(key)
		}
		return nil, c.createFailed(stored, err)
	}
	if !created {
		return c.continueExisting(ctx, stored)
	}
	c.transition(Record{}, stored, Event{Kind: EventCreate})
	// in_flight, attempt 1, journaled: but not sent yet. Authorize runs on
	// the send, after the create: before it, the client does not know
	// whether the operation is journaled already (then nothing is sent,
	// and no Authorize runs). A send it stops leaves this intent unsent
	// (unsentIntent), and the next send reuses it.
	d := c.newDriver(stored)
	d.next, d.journaled, d.maybeApplied = stepSend, true, false
	d.callersDeadline = true
	return d.run(ctx)
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
	ctx, exit, err := c.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer exit.done()
	key, err := c.mintKey(p.scope, p.id)
	if err != nil {
		return nil, err
	}
	rec := p.record(key, c.newForm())
	rec.State = StatePending
	rec.Link = c.link(ctx)
	stored, created, err := c.journal.Create(ctx, rec)
	if err != nil && p.journaledAsGiven(stored.Fingerprint, err) {
		err = nil
	}
	if err != nil {
		return nil, c.createFailed(stored, err)
	}
	if created {
		c.transition(Record{}, stored, Event{Kind: EventCreate})
	}
	return &Operation{c: c, key: stored.Key, scope: stored.Scope, id: stored.ID,
		method: stored.Method, url: stored.URL, link: stored.Link}, nil
}

// journaledAsGiven reports whether a Create refused with err found the
// operation journaled, with fingerprint, as the same request with its
// URL's origin spelled as a build before the canonical spelling journaled
// it (see prepared.givenFingerprint).
func (p *prepared) journaledAsGiven(fingerprint string, err error) bool {
	return p.givenFingerprint != "" && fingerprint == p.givenFingerprint && errors.Is(err, ErrFingerprintMismatch)
}

// createFailed reports a refused Create: a fingerprint mismatch comes as an
// *OperationError naming the existing record, its key and state, so that
// the caller can act on it; any other error as the journal gave it.
func (c *Client) createFailed(existing Record, err error) error {
	if errors.Is(err, ErrFingerprintMismatch) && existing.Key != "" {
		e := opError(existing, err)
		e.sentinel = ErrFingerprintMismatch
		return e
	}
	return err
}

// Lookup returns what the journal holds for (scope, id); an empty scope
// means Config.Scope. It returns ErrNotFound when nothing is journaled.
func (c *Client) Lookup(ctx context.Context, scope, id string) (Record, error) {
	ctx, exit, err := c.enter(ctx)
	if err != nil {
		return Record{}, err
	}
	defer exit.done()
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
	}, "reconciled as "+state.String())
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
	}, "canceled by the application or an operator")
}

// settle applies an operator's change with a durable compare-and-swap,
// re-reading on a concurrent change.
func (c *Client) settle(ctx context.Context, key string, change func(*Record) error, detail string) error {
	ctx, exit, err := c.enter(ctx)
	if err != nil {
		return err
	}
	defer exit.done()
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
		why := Event{Kind: EventOperator, Detail: detail}
		stored, err := c.journal.Update(ctx, next, Durable, why)
		if errors.Is(err, ErrConflict) {
			continue
		}
		if err != nil {
			return err
		}
		c.transition(rec, stored, why)
		return nil
	}
}

// debugging reports whether the logger takes debug records: the hot path
// builds their attributes (a dozen allocations) only when it does.
func (c *Client) debugging() bool { return c.log.Enabled(context.Background(), slog.LevelDebug) }

// transition reports a journaled change to the hook and the log.
func (c *Client) transition(from, to Record, why Event) {
	code := 0
	if to.Response != nil {
		code = to.Response.StatusCode
	}
	if c.debugging() {
		c.log.Debug("idem: transition", "key", to.Key, "scope", to.Scope, "id", to.ID,
			"from", from.State.String(), "to", to.State.String(), "attempt", to.Attempts, "status", code,
			"event", why.Kind.String(), "detail", why.Detail)
	}
	if c.cfg.OnTransition != nil && from.State != to.State {
		c.cfg.OnTransition(Transition{Key: to.Key, Scope: to.Scope, ID: to.ID, From: from.State, To: to.State,
			Attempt: to.Attempts, StatusCode: code, Reason: to.LastError, Kind: why.Kind, Detail: why.Detail, At: to.UpdatedAt})
	}
}

// flight is one operation being driven by this process; other callers for
// the same operation wait for it instead of racing it.
type flight struct {
	// done is closed when the leader is done. The first caller to wait
	// makes it, under c.mu: a call that no other joins, most of them,
	// makes no channel. When there is one, each follower gets its own copy
	// of the Result, for a caller may change its Header or Body (the
	// standard client's *http.Response shares them with the Result).
	done chan struct{}
	// fingerprint is the request the leader drives ("" when it drives a
	// journaled operation as it is): a call with another shares nothing.
	fingerprint string
	res         *Result
	err         error
}

// startFlight registers this call as the one driving op in this process,
// or returns the flight already doing so.
func (c *Client) startFlight(op scopeID, fingerprint string) (f *flight, leader bool) {
	// Made before the lock, which every call takes several times; unused
	// by a follower, which is rare.
	mine := &flight{fingerprint: fingerprint}
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, running := c.flights[op]; running {
		if f.done == nil {
			f.done = make(chan struct{})
		}
		return f, false
	}
	c.flights[op] = mine
	return mine, true
}

// endFlight ends the leader's flight: once it is out of c.flights no
// caller can join it, so a channel none made then is needed by none.
func (c *Client) endFlight(op scopeID, f *flight) {
	c.mu.Lock()
	delete(c.flights, op)
	done := f.done
	c.mu.Unlock()
	if done != nil {
		// The leader returns f.res to its caller; the followers copy this
		// one, which no caller holds.
		f.res = f.res.clone()
		close(done)
	}
}

// run executes fn for (scope, id) unless another call in this process is
// already driving that operation, in which case it waits for that call and
// returns a copy of its answer (a caller may change its Result). A follower
// whose leader was stopped by its own context, drives another request
// (fingerprint) or was refused one, runs fn itself once the leader is done:
// the journal then answers it.
func (c *Client) run(ctx context.Context, scope, id, fingerprint string, fn func(context.Context) (*Result, error)) (*Result, error) {
	ctx, exit, err := c.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer exit.done()
	op := scopeID{scope, id}
	for {
		f, leader := c.startFlight(op, fingerprint)
		if leader {
			return c.lead(ctx, op, f, fn)
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if f.err != nil && (errors.Is(f.err, context.Canceled) || errors.Is(f.err, context.DeadlineExceeded)) && ctx.Err() == nil {
			continue // the leader gave up for its own reasons; try ourselves
		}
		if f.fingerprint != fingerprint || errors.Is(f.err, ErrFingerprintMismatch) {
			continue // the leader's answer is to another request
		}
		return f.res.clone(), f.err
	}
}

// lead runs fn as the leader of flight f. A function of its own: a defer
// in run's loop would be allocated on every call.
func (c *Client) lead(ctx context.Context, op scopeID, f *flight, fn func(context.Context) (*Result, error)) (*Result, error) {
	defer c.endFlight(op, f)
	f.res, f.err = fn(ctx)
	return f.res, f.err
}

// continueExisting drives an operation found in the journal: it returns a
// settled result at once, and otherwise takes the lease and drives it,
// waiting while another worker holds it.
func (c *Client) continueExisting(ctx context.Context, rec Record) (*Result, error) {
	wait := 0
	for {
		switch rec.State {
		case StateSucceeded:
			res := resultFrom(rec)
			res.Journaled = true
			return res, nil
		case StateRejected:
			res := resultFrom(rec)
			res.Journaled = true
			return res, opError(rec, nil)
		case StateCanceled, StateExpired:
			return nil, opError(rec, nil)
		}
		acquired, err := c.journal.Acquire(ctx, rec.Key, c.owner, c.cfg.LeaseDuration)
		if err == nil {
			d := c.newDriver(acquired)
			d.callersDeadline = true
			return d.run(ctx)
		}
		if !errors.Is(err, ErrLeased) && !errors.Is(err, ErrNotActive) {
			return nil, err
		}
		rec = acquired
		if errors.Is(err, ErrLeased) && c.adopt(rec.Key, rec.Lease) {
			// The lease is this client's own, and no call of it holds it:
			// a call that returned left it behind (its journal write's
			// answer was lost, say). Waiting for it to lapse would wait for
			// nobody; its writes stay fenced by the lease's epoch.
			d := c.newDriver(rec)
			d.callersDeadline = true
			return d.run(ctx)
		}
		if errors.Is(err, ErrLeased) {
			// Another process drives it: poll until it settles or its lease
			// frees (it renews while alive; when it dies, the journal
			// frees it at once if it can see that, else when it lapses).
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
// so a lease only lapses when its process is gone. It renews each by key
// and epoch, never by owner name, every LeaseDuration/3. A renewal that
// fails, or does not answer within that interval, is tried again soon
// rather than at the next interval: a lease has three intervals in all,
// and a journal that fails now and then (its database restarting, its
// connections cut) must not cost a live worker its operations.
func (c *Client) renewLeases() {
	defer c.bg.Done()
	every := c.cfg.LeaseDuration / 3
	retry := min(every/10, time.Second)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-c.bgCtx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		held := maps.Clone(c.held)
		c.mu.Unlock()
		if len(held) == 0 {
			t.Reset(every)
			continue
		}
		ctx, cancel := context.WithTimeout(c.bgCtx, every)
		_, err := c.journal.Renew(ctx, held, c.cfg.LeaseDuration)
		cancel()
		if err != nil && c.bgCtx.Err() == nil {
			c.log.Warn("idem: renewing leases failed; trying again", "owner", c.owner, "leases", len(held), "error", err)
			t.Reset(retry)
			continue
		}
		t.Reset(every)
	}
}

// resumeEvery runs Resume every interval until Close or Shutdown
// (Config.ResumeInterval).
func (c *Client) resumeEvery(interval time.Duration) {
	defer c.bg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-c.closing:
			return
		case <-t.C:
		}
		// Resume logs the pass itself.
		_, err := c.Resume(c.bgCtx, inBackground())
		switch {
		case errors.Is(err, ErrClientClosed), c.bgCtx.Err() != nil:
			return
		case err != nil:
			c.log.Warn("idem: background resume failed", "error", err)
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
