package idem

import (
	"bytes"
	"encoding/json"
	"errors"
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
// zero value of each field means its default. New refuses a negative
// duration, and a positive one below 1 ms as a unit mistake (Budget: 30
// is 30 ns), and a negative count or rate (or a NaN or infinite one),
// naming the field: MaxAttempts 1, not -1, means no retry.
type RetryPolicy struct {
	// MaxAttempts is the most attempts per call, counting the first. An
	// attempt is one send of the request by the client; Go's transport may
	// send it once more by itself when a reused connection dies before any
	// reply, and such re-sends are counted apart, in
	// Result.TransportResends and Record.TransportResends. Replays made to
	// check the status (ReplayStatus) are bounded by MaxStatusChecks.
	// Defaults to 5.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the wait between attempts and between
	// status checks: exponential from MinBackoff, capped at MaxBackoff, with
	// full jitter. Default to 100 ms and 5 s. MaxBackoff is also how long an
	// operation left pending or unknown waits before Resume picks it up.
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// MaxRetryAfter is the longest a call waits when the server asks for
	// a wait with Retry-After. A server that asks for longer ends the call,
	// and the operation is due again (for Resume) when the server said,
	// never sooner. Defaults to 30 s. No wait ever runs past the context's
	// deadline or the call's Budget: a call whose next attempt would start
	// after either returns at once, due again when that attempt would have
	// started.
	MaxRetryAfter time.Duration
	// Budget is the total time one call may spend starting attempts and
	// status checks. Defaults to 30 s. It does not end a Do or Send whose
	// context has a deadline while the server says it is processing the
	// key: the deadline does (see MaxStatusChecks).
	Budget time.Duration
	// MaxStatusChecks is the most status checks per call. Defaults to 8.
	// A Do or Send whose context has a deadline waits for a server that
	// says it is still processing the key (status "processing") until the
	// deadline instead, however many checks that takes; the count bounds
	// calls without a deadline, and each operation of Resume. After a
	// server crash, a key whose request was running reads "processing"
	// until the server's lock timeout lapses (a minute by default for
	// package server).
	MaxStatusChecks int
	// RetryRatio and MinRetriesPerSecond size the retry budget that the
	// client's operations share, so that an outage does not turn into a
	// retry storm: every first attempt deposits RetryRatio tokens, the
	// budget refills by MinRetriesPerSecond tokens a second, and every
	// re-send spends one: a retry, a ReplayStatus replay, a send after a
	// status check said not_found. A call's first write of an operation
	// is its first attempt, whatever sends it: Resume's first replay of
	// an operation, or its first send after a not_found, deposits and
	// spends nothing, so that a process that only resumes is not held to
	// the budget's floor. A re-send the budget refuses ends the
	// call with ErrRetryBudgetExhausted as its cause. Default to 0.2 and
	// 10.
	RetryRatio          float64
	MinRetriesPerSecond float64
}

// withDefaults sets the counts and ratios of p that are zero to their
// defaults; Config.checkDurations has checked and set its durations.
func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 5
	}
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
// exponential with full jitter. New refuses the policies it was not
// made for (MaxBackoff below MinBackoff, a negative bound), but a wait
// is drawn on the caller's goroutine, so such a policy gets a wait
// within its bounds, never a panic of rand.N.
func (p RetryPolicy) backoff(n int) time.Duration {
	lo := max(p.MinBackoff/2, 0)
	ceiling := max(p.MinBackoff, 0) << min(max(n-1, 0), 30)
	if ceiling <= 0 || ceiling > p.MaxBackoff {
		ceiling = p.MaxBackoff
	}
	if ceiling <= lo {
		return max(ceiling, 0)
	}
	return lo + rand.N(ceiling-lo+1)
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
	// Terminal (rejected), reported as ErrKeyConflict, when it answers
	// the first attempt of the operation that may have reached the
	// server. Answering a re-send (a retry, a ReplayStatus replay, a send
	// after not_found) once an earlier attempt may have been processed
	// (written and not answered, or answered with a verdict other than
	// Retry; not one refused before processing), it
	// means the key is that attempt's, which may have been applied (the
	// client sends nothing else under the key): the outcome is unknown,
	// for the status check, never a rejection.
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
	// Unknown: the request was written and no final answer came (a
	// timeout, a reset, an EOF, a 1xx): never re-send blindly; check
	// status.
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
	// received it. A failed attempt the trace did not follow (a transport
	// that sends a request of its own) counts as written.
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
//	1xx (a 101 Switching Protocols)           → Unknown (no final answer)
//	2xx (303 too)                             → Succeeded, whatever the body
//	a key conflict the server names           → KeyConflict (any other status; see below)
//	any other status marked as replayed       → Rejected (the server's stored answer)
//	409                                       → InProgress (wait, then check status)
//	429, 401, 407                             → Retry (refused before processing)
//	408, 5xx                                  → RetrySameKey
//	307, 308 to another origin                → Rejected (not followed: see Config.HTTPClient)
//	any other status (422 and 600+ included)  → Rejected
//
// A 2xx (or any answer) whose body was cut off is Unknown: the server
// received the request, and a status check recovers its answer.
//
// A key conflict is recognised only in the forms a server documents, never
// from a status code alone, because a 422 or a 409 is more often a plain
// validation error or a request still in progress:
//
//	idem's server package   any status but a success, problem type urn:idem:problem:key-reused
//	hono-idempotency        problem type https://hono-idempotency.dev/errors/fingerprint-mismatch
//	Stripe                  400 with {"error":{"type":"idempotency_error"}}
//	gopotency               422 "request with same idempotency key has different content"
//	atomic phases (Brandur) 409 "…a mismatch between this request's parameters and the
//	                        parameters of a previously stored request…"
//
// A replay mark is any of Idempotent-Replayed, Idempotency-Replayed or
// X-Idempotent-Replayed set to true: a replayed 409 is the handler's own
// answer, stored for the key, and as final as any other.
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
	reason := statusReason(code)
	if a.Err != nil {
		return Decision{Verdict: Unknown, Reason: reason + " with its body cut off: " + a.Err.Error()}
	}
	if code >= 100 && code < 200 {
		// No final answer (RFC 9110 §15.2): net/http returns a 101 as the
		// response because the connection changed protocols, not because
		// the server answered the write, which it received.
		return Decision{Verdict: Unknown, Reason: reason + ": no final answer to the request"}
	}
	// A success status is the server saying it applied the request: no body
	// overrides it, or a write that took effect would be reported as not
	// applied and sent again under a new key.
	if code >= 200 && code < 300 || code == http.StatusSeeOther {
		return Decision{Verdict: Succeeded, Reason: reason}
	}
	if form, ok := keyConflict(code, h, a.Body); ok {
		return Decision{Verdict: KeyConflict, Reason: reason + ": the key was used with another request (" + form + ")"}
	}
	after := RetryAfter(h, time.Now()) // not a success's: read only here
	switch {
	case wire.Replayed(h):
		return Decision{Verdict: Rejected, Reason: reason + " replayed from the server's store: its answer for the key"}
	case code == http.StatusConflict:
		return Decision{Verdict: InProgress, RetryAfter: after, Reason: reason + ": the key is being processed"}
	case code == http.StatusTooManyRequests, code == http.StatusUnauthorized, code == http.StatusProxyAuthRequired:
		return Decision{Verdict: Retry, RetryAfter: after, Reason: reason + ": refused before processing"}
	case code >= 500 && code <= 599, code == http.StatusRequestTimeout:
		return Decision{Verdict: RetrySameKey, RetryAfter: after, Reason: reason}
	case code == http.StatusTemporaryRedirect, code == http.StatusPermanentRedirect:
		return Decision{Verdict: Rejected, Reason: fmt.Sprintf("%s: redirected to %q, another origin; idem follows redirects only within the request's origin, so that a write and its credentials never go elsewhere", reason, redactString(h.Get("Location")))}
	default:
		return Decision{Verdict: Rejected, Reason: reason}
	}
}

// statusReasons are Classify's reasons "HTTP 100" to "HTTP 599", made
// once: made per call, the string would be the only allocation of a
// success's Classify.
var statusReasons = func() (r [500]string) {
	for i := range r {
		r[i] = "HTTP " + strconv.Itoa(100+i)
	}
	return r
}()

func statusReason(code int) string {
	if code >= 100 && code < 100+len(statusReasons) {
		return statusReasons[code-100]
	}
	var buf [16]byte // one allocation, the string, and no fmt
	return string(strconv.AppendInt(append(buf[:0], "HTTP "...), int64(code), 10))
}

// Problem types and bodies by which servers say a key was reused with
// another request; see Classify.
const (
	honoFingerprintMismatch = "https://hono-idempotency.dev/errors/fingerprint-mismatch"
	gopotencyMismatch       = "request with same idempotency key has different content"
	atomicPhasesMismatch    = "parameters of a previously stored request with the same idempotency-key"
)

// keyConflict recognises the documented forms of "this key was used with
// another request" and names the one it found.
func keyConflict(code int, h http.Header, body []byte) (string, bool) {
	if p, ok := wire.ParseProblem(h.Get("Content-Type"), body); ok {
		switch p.Type {
		case wire.ProblemKeyReused, honoFingerprintMismatch:
			return "problem type " + p.Type, true
		}
	}
	switch code {
	case http.StatusBadRequest:
		var stripe struct {
			Error struct {
				Type string `json:"type"`
			} `json:"error"`
		}
		if json.Unmarshal(body, &stripe) == nil && stripe.Error.Type == "idempotency_error" {
			return "error type idempotency_error", true
		}
	case http.StatusUnprocessableEntity:
		if bytes.Contains(bytes.ToLower(body), []byte(gopotencyMismatch)) {
			return "body: " + gopotencyMismatch, true
		}
	case http.StatusConflict:
		if bytes.Contains(bytes.ToLower(body), []byte(atomicPhasesMismatch)) {
			return "body: mismatch with the parameters of a previously stored request", true
		}
	}
	return "", false
}

// RetryAfter parses a Retry-After header, as delay-seconds or an HTTP date
// relative to now. It returns zero when the header is absent, malformed or
// in the past.
func RetryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	// delay-seconds is 1*DIGIT, with no bound: a run of digits beyond
	// int64 is a valid, very long wait, which ParseInt reports as out of
	// range with the largest int64, and the cap applies to it as to any
	// long wait. Reading it as malformed would make it no wait at all.
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
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
