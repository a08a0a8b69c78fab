package idem

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/wire"
)

// RetryPolicy bounds how hard one call (Do, Send, or one operation of
// Resume) tries before it returns, leaving the operation journaled. The
// zero value of each field means its default.
type RetryPolicy struct {
	// MaxAttempts is the most sends of the request per call, counting the
	// first. Defaults to 5.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the wait between attempts and between
	// status checks: exponential from MinBackoff, capped at MaxBackoff, with
	// full jitter. Default to 100 ms and 5 s. MaxBackoff is also how long an
	// operation left pending or unknown waits before Resume picks it up.
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// MaxRetryAfter caps the wait a server asks for with Retry-After.
	// Defaults to 30 s. No wait ever runs past the context's deadline: a
	// call whose next attempt would start after the deadline returns at once.
	MaxRetryAfter time.Duration
	// Budget is the total time one call may spend starting attempts and
	// status checks. Defaults to 30 s.
	Budget time.Duration
	// MaxStatusChecks is the most status checks per call. Defaults to 8.
	MaxStatusChecks int
	// RetryRatio and MinRetriesPerSecond size the retry budget that the
	// client's operations share, so that an outage does not turn into a
	// retry storm: every first attempt deposits RetryRatio tokens, the
	// budget refills by MinRetriesPerSecond tokens a second, and every
	// re-send spends one. Default to 0.2 and 10.
	RetryRatio          float64
	MinRetriesPerSecond float64
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 5
	}
	def(&p.MinBackoff, 100*time.Millisecond)
	def(&p.MaxBackoff, 5*time.Second)
	def(&p.MaxRetryAfter, 30*time.Second)
	def(&p.Budget, 30*time.Second)
	if p.MaxStatusChecks <= 0 {
		p.MaxStatusChecks = 8
	}
	if p.RetryRatio <= 0 {
		p.RetryRatio = 0.2
	}
	if p.MinRetriesPerSecond <= 0 {
		p.MinRetriesPerSecond = 10
	}
	return p
}

// backoff returns the wait before retry n (1 for the first retry):
// exponential with full jitter.
func (p RetryPolicy) backoff(n int) time.Duration {
	ceiling := p.MinBackoff << min(n-1, 30)
	if ceiling <= 0 || ceiling > p.MaxBackoff {
		ceiling = p.MaxBackoff
	}
	return p.MinBackoff/2 + rand.N(ceiling-p.MinBackoff/2+1)
}

// Verdict is what one attempt's result means for the operation.
type Verdict uint8

const (
	// Succeeded: a 2xx; the request was applied. Terminal.
	Succeeded Verdict = iota + 1
	// Rejected: a definitive answer other than success, such as a 4xx or a
	// 5xx the server says it replayed from its store. Terminal.
	Rejected
	// KeyConflict: the server says the key was used with another request.
	// Terminal (rejected), reported as ErrKeyConflict.
	KeyConflict
	// Retry: the request did not take effect (it was never written, or the
	// server refused it before processing, as with 429): send it again with
	// the same key after a backoff.
	Retry
	// RetrySameKey: the request may have taken effect (a 5xx), but the
	// server keeps keys, so re-sending the same key is safe: retry within
	// the policy, then check status.
	RetrySameKey
	// InProgress: the server is still processing the key (409): wait, then
	// check status.
	InProgress
	// Unknown: the request was written and no answer came (a timeout, a
	// reset, an EOF): never re-send blindly; check status.
	Unknown
)

var verdictNames = [...]string{Succeeded: "succeeded", Rejected: "rejected", KeyConflict: "key conflict",
	Retry: "retry", RetrySameKey: "retry with the same key", InProgress: "in progress", Unknown: "unknown"}

func (v Verdict) String() string {
	if v >= Succeeded && v <= Unknown {
		return verdictNames[v]
	}
	return fmt.Sprintf("Verdict(%d)", uint8(v))
}

// Attempt is what one send produced, as a Classifier sees it.
type Attempt struct {
	// Response is the server's answer, or nil when Err is set. Its body has
	// been read into Body.
	Response *http.Response
	Body     []byte
	// Err is the transport error, if any. An Err with a Response means the
	// body could not be read in full.
	Err error
	// Written reports whether the request was written to the connection,
	// as httptrace saw it: when it is false, the server cannot have
	// received it.
	Written bool
}

// Decision is a Classifier's answer.
type Decision struct {
	Verdict Verdict
	// RetryAfter is the wait the server asked for, or zero.
	RetryAfter time.Duration
	// Reason says why, for the journal and the logs.
	Reason string
}

// A Classifier decides what an attempt's result means. It must be a pure
// function of the attempt. Classify is the default; a replacement can
// handle an API's own conventions and fall back to Classify.
type Classifier func(Attempt) Decision

// Classify is the default Classifier:
//
//	not written (dial failure, refused)       → Retry (with or without an error)
//	written, then a timeout, reset or EOF     → Unknown
//	2xx (303 too)                             → Succeeded
//	409 saying the key was reused             → KeyConflict
//	409                                       → InProgress
//	422, 417, 400 idempotency_error           → KeyConflict
//	  (a 422 whose problem type says something else is Rejected)
//	429, 401, 407                             → Retry (refused before processing)
//	5xx marked as replayed                    → Rejected (the server's stored answer)
//	408, 5xx                                  → RetrySameKey
//	any other status (600 and above included) → Rejected
//
// A 2xx whose body was cut off is Unknown: the server applied the request
// but its answer was lost, and a status check recovers it.
func Classify(a Attempt) Decision {
	if a.Response == nil {
		cause := "no response"
		if a.Err != nil {
			cause = a.Err.Error()
		}
		if !a.Written {
			return Decision{Verdict: Retry, Reason: "not sent: " + cause}
		}
		return Decision{Verdict: Unknown, Reason: "sent, then: " + cause}
	}
	code := a.Response.StatusCode
	h := a.Response.Header
	after := RetryAfter(h, time.Now())
	reason := fmt.Sprintf("HTTP %d", code)
	if a.Err != nil {
		return Decision{Verdict: Unknown, Reason: reason + " with its body cut off: " + a.Err.Error()}
	}
	problem, isProblem := wire.ParseProblem(h.Get("Content-Type"), a.Body)
	reused := isProblem && problem.Type == wire.ProblemKeyReused
	switch {
	case code >= 200 && code < 300, code == http.StatusSeeOther:
		return Decision{Verdict: Succeeded, Reason: reason}
	case code == http.StatusConflict && (reused || mentionsMismatch(a.Body)):
		return Decision{Verdict: KeyConflict, Reason: reason + ": key used with another request"}
	case code == http.StatusConflict:
		return Decision{Verdict: InProgress, RetryAfter: after, Reason: reason + ": the key is being processed"}
	case reused, code == http.StatusExpectationFailed,
		code == http.StatusBadRequest && bytes.Contains(a.Body, []byte("idempotency_error")):
		return Decision{Verdict: KeyConflict, Reason: reason + ": key used with another request"}
	case code == http.StatusUnprocessableEntity && (!isProblem || problem.Type == "" || problem.Type == "about:blank"):
		return Decision{Verdict: KeyConflict, Reason: reason + ": key used with another request"}
	case code == http.StatusTooManyRequests, code == http.StatusUnauthorized, code == http.StatusProxyAuthRequired:
		return Decision{Verdict: Retry, RetryAfter: after, Reason: reason + ": refused before processing"}
	case code >= 500 && code <= 599 && wire.Replayed(h):
		return Decision{Verdict: Rejected, Reason: reason + " replayed from the server's store"}
	case code >= 500 && code <= 599, code == http.StatusRequestTimeout:
		return Decision{Verdict: RetrySameKey, RetryAfter: after, Reason: reason}
	default:
		return Decision{Verdict: Rejected, Reason: reason}
	}
}

// mentionsMismatch recognises the bodies some servers send with a 409 when
// the key was reused with other parameters.
func mentionsMismatch(body []byte) bool {
	b := bytes.ToLower(body)
	for _, s := range []string{"params_mismatch", "parameters mismatch", "mismatch", "idempotency_error"} {
		if bytes.Contains(b, []byte(s)) {
			return true
		}
	}
	return false
}

// RetryAfter parses a Retry-After header, as delay-seconds or an HTTP date
// relative to now. It returns zero when the header is absent, malformed or
// in the past.
func RetryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		if secs > int64(24*time.Hour/time.Second) {
			return 24 * time.Hour
		}
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), 24*time.Hour)
	}
	return 0
}

// retryBudget is a token bucket shared by a client's operations: first
// attempts deposit, re-sends spend, and time refills a floor.
type retryBudget struct {
	mu      sync.Mutex
	tokens  float64
	max     float64
	ratio   float64
	perSec  float64
	last    time.Time
	nowFunc func() time.Time
}

func newRetryBudget(p RetryPolicy, now func() time.Time) *retryBudget {
	max := 10 * p.MinRetriesPerSecond
	return &retryBudget{tokens: max, max: max, ratio: p.RetryRatio, perSec: p.MinRetriesPerSecond, last: now(), nowFunc: now}
}

func (b *retryBudget) refill() {
	now := b.nowFunc()
	b.tokens = min(b.max, b.tokens+now.Sub(b.last).Seconds()*b.perSec)
	b.last = now
}

func (b *retryBudget) deposit() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill()
	b.tokens = min(b.max, b.tokens+b.ratio)
}

func (b *retryBudget) withdraw() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill()
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
