package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/wire"
)

// Config configures a Middleware. Store and Scope are required; every
// other field's zero value means its default. New refuses a duration (Retention,
// LockTimeout, RetryAfter, SweepInterval) below 1 ms as a unit mistake:
// LockTimeout: 30 is 30 ns, not 30 s.
type Config struct {
	// Store keeps the entries. Required. The middleware never closes it.
	Store Store

	// Methods are the methods whose requests carry a key and are made
	// idempotent; requests with other methods pass straight through.
	// Defaults to POST and PATCH.
	Methods []string

	// Header is the request header carrying the key. Defaults to
	// wire.KeyHeader ("Idempotency-Key").
	Header string

	// MaxKeyLength is the longest key accepted, in bytes of the unquoted
	// key. Defaults to wire.MaxKeyLength (255).
	MaxKeyLength int

	// Scope names the caller a request comes from: its tenant, account or
	// credential as the service's authentication established it, never
	// anything the caller can choose freely. Keys are looked up per scope,
	// so that one caller's key never reaches another's stored response
	// (neither as a replay nor on the status endpoint) and two callers may
	// use the same key independently. Required: New refuses a Config
	// without it, because one shared key space hands a stored response to
	// anyone who can name its key. An API with exactly one tenant says so
	// with SingleTenant. The scope may be a secret: the middleware's logs
	// name a key by a hash of scope and key (key_hash), never the scope,
	// and the otel module's server hooks record it only through
	// WithServerTenant.
	Scope func(*http.Request) string

	// Retention is how long an entry counts: from its claim while it is in
	// progress, and from the moment its response was stored once complete.
	// After that it is swept, and a request reusing the key is a new
	// request. Defaults to 24 h. Must be longer than LockTimeout.
	Retention time.Duration

	// LockTimeout is how long an in-progress entry keeps its lock without
	// a heartbeat. While a handler runs, and until its response is stored,
	// the middleware renews the lock every LockTimeout/3, so a lock only
	// goes stale when the process that held it died or lost its store; the
	// next request with the same key and payload then takes the entry over
	// and runs the handler again, instead of getting 409 forever. When no
	// renewal succeeded for 2/3 of LockTimeout, the handler's context is
	// canceled (cause ErrLockNotRenewed) before that can happen. A
	// response the store has not stored within LockTimeout/3 is answered
	// 409 and stored in the background, so that a store call that hangs
	// never keeps the lock from being renewed. Defaults to 1 min.
	LockTimeout time.Duration

	// RetryAfter is the Retry-After sent with 409 (in progress) and 503
	// (store unavailable), rounded up to whole seconds. It is also the
	// longest wait between two tries to store a response the store failed
	// to record. Defaults to 1 s.
	RetryAfter time.Duration

	// StorePolicy decides what becomes of a key whose handler answered
	// 5xx or panicked: stored (StoreAll), or released for another run
	// (SkipServerErrors). Defaults to StoreAll.
	StorePolicy StorePolicy

	// MaxBodyBytes is the largest request body accepted on an idempotent
	// method; a larger one gets 413 and nothing runs. Defaults to 1 MiB.
	MaxBodyBytes int64

	// SweepInterval is how often expired entries are deleted. Defaults to
	// 1 min.
	SweepInterval time.Duration

	// Logger receives the middleware's diagnostics: store failures, lock
	// take-overs, sweeps. It never receives request or response bodies nor
	// header values; keys appear only as a short hash. Defaults to
	// discarding everything.
	Logger *slog.Logger

	// OnOutcome is called once for each request with a keyed method, after
	// its answer was written (or, when the handler panicked, as the panic
	// unwinds, with Status 500), with what the middleware did: for metrics and
	// span attributes (the module github.com/idemkit/idem/otel uses it). It
	// runs on the request's goroutine, with its context; keep it fast.
	OnOutcome func(ctx context.Context, o Outcome)

	// now is the clock; tests replace it.
	now func() time.Time
}

// SingleTenant is the Scope of an API with exactly one tenant: every
// request is in the same scope (""), so any caller that can name a key gets
// its stored response. Pass it as Config.Scope only when every caller that
// reaches the middleware is the same party; a service with several tenants
// or credentials must return the caller's own instead.
func SingleTenant(*http.Request) string { return "" }

// StorePolicy decides what becomes of a key whose handler failed: answered
// 5xx or panicked. The zero value is StoreAll, the policy under which a
// handler never runs twice because it failed.
type StorePolicy int

const (
	// StoreAll stores every response the handler wrote, 5xx included, as
	// Stripe does, and for a handler that panicked a 500 problem of type
	// ProblemHandlerPanicked (the panic goes on). A retry gets the stored
	// failure instead of running the handler again: right whenever a
	// handler may have acted before it failed.
	StoreAll StorePolicy = iota
	// SkipServerErrors releases the key after a 5xx or a panic instead of
	// storing anything: the 5xx goes to the client unstored, and a retry
	// with the same key runs the handler again. Opt into it only when
	// every handler's failure undoes whatever it did (one transaction that
	// rolls back), or the retry may act twice.
	SkipServerErrors
)

func (p StorePolicy) String() string {
	switch p {
	case StoreAll:
		return "StoreAll"
	case SkipServerErrors:
		return "SkipServerErrors"
	}
	return fmt.Sprintf("StorePolicy(%d)", int(p))
}

// Defaults of Config's fields.
const (
	DefaultRetention     = 24 * time.Hour
	DefaultLockTimeout   = time.Minute
	DefaultRetryAfter    = time.Second
	DefaultMaxBodyBytes  = 1 << 20
	DefaultSweepInterval = time.Minute
)

// minDuration is the shortest duration New accepts in Config: shorter is
// shorter than any store round trip, and a bare number meant as seconds
// (LockTimeout: 30, which is 30 ns) is the likely cause.
const minDuration = time.Millisecond

// ConfigError reports a Config field that New cannot accept.
type ConfigError struct {
	// Field is the name of the Config field, such as "Retention".
	Field string
	// Problem says what is wrong with it.
	Problem string
}

func (e *ConfigError) Error() string {
	return "idem server: Config." + e.Field + ": " + e.Problem
}

// withDefaults returns c with every zero field set to its default, or the
// first field that is wrong.
func (c Config) withDefaults() (Config, error) {
	bad := func(field, format string, args ...any) (Config, error) {
		return Config{}, &ConfigError{Field: field, Problem: fmt.Sprintf(format, args...)}
	}
	if c.Store == nil {
		return bad("Store", "required; use NewMemoryStore or OpenSQLiteStore")
	}
	if len(c.Methods) == 0 {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	methods := make([]string, len(c.Methods))
	for i, m := range c.Methods {
		if !wire.IsToken(m) {
			return bad("Methods", "%q is not an HTTP method", m)
		}
		methods[i] = strings.ToUpper(m)
	}
	c.Methods = methods
	if c.Header == "" {
		c.Header = wire.KeyHeader
	}
	if !wire.IsToken(c.Header) {
		return bad("Header", "%q is not a valid header name", c.Header)
	}
	if c.MaxKeyLength == 0 {
		c.MaxKeyLength = wire.MaxKeyLength
	}
	if c.MaxKeyLength < 0 {
		return bad("MaxKeyLength", "%d is negative", c.MaxKeyLength)
	}
	if c.Scope == nil {
		return bad("Scope", "required: return the authenticated tenant or credential of the request, "+
			"so that one caller never gets another's stored responses; if the API has exactly one tenant, set it to server.SingleTenant")
	}
	durations := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"Retention", &c.Retention, DefaultRetention},
		{"LockTimeout", &c.LockTimeout, DefaultLockTimeout},
		{"RetryAfter", &c.RetryAfter, DefaultRetryAfter},
		{"SweepInterval", &c.SweepInterval, DefaultSweepInterval},
	}
	for _, d := range durations {
		if *d.v == 0 {
			*d.v = d.def
		}
		if *d.v < 0 {
			return bad(d.name, "%s is negative", *d.v)
		}
		if *d.v < minDuration {
			// A bare number (LockTimeout: 30) is nanoseconds: a lock that
			// is stale as soon as it is taken turns the middleware into a
			// pass-through, and a sweep or a renewal every few
			// nanoseconds spins.
			return bad(d.name, "%s is %s; it is a time.Duration, counted in nanoseconds — did you mean %d*time.Second? "+
				"Durations below %s are refused as unit mistakes", d.name, *d.v, int64(*d.v), minDuration)
		}
	}
	if c.Retention <= c.LockTimeout {
		return bad("Retention", "%s must be longer than LockTimeout (%s), or entries would expire while their handler runs", c.Retention, c.LockTimeout)
	}
	switch c.StorePolicy {
	case StoreAll, SkipServerErrors:
	default:
		return bad("StorePolicy", "unknown policy %d", int(c.StorePolicy))
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxBodyBytes < 0 {
		return bad("MaxBodyBytes", "%d is negative", c.MaxBodyBytes)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c, nil
}
