package idem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/wire"
)

// A driver takes one leased operation as far as one call may. It
// alternates two steps until the operation is settled or the call must
// stop:
//
//   - send (attempt.go): a round of attempts through go-retryablehttp,
//     each journaled before it starts and classified when it ends;
//   - check (status.go's checker, driven by checkStatus below): ask the
//     server what became of a request whose outcome is unknown.
//
// Every decision is journaled with the reason, so the record's history
// tells the story. A driver is used by one goroutine.
type driver struct {
	c     *Client
	rec   Record // the journal's copy, as last written or read
	lease Lease  // the lease this driver writes under
	form  keyForm

	// next is the step to take; why says why, for the history.
	next step
	why  string
	// journaled: the next send is already journaled (Do created the
	// record in_flight, attempt 1).
	journaled bool
	// authErr is Config.Authorize's failure on the next send, which is
	// then no attempt.
	authErr *authorizeError

	deadline time.Time // end of this call's budget
	// callersDeadline: this call drives one operation for its caller (Do,
	// Send), whose context's deadline, when it has one, bounds the wait
	// for a server that says it is processing (see waitsForDeadline).
	callersDeadline bool
	sends           int  // attempts this call made
	checks          int  // status checks this call made
	replayed        bool // the status check in progress re-sent the request
	// resend: the next send follows a status check's not_found, a re-send
	// that spends the shared retry budget as a retry does.
	resend bool
	// wrote: this call has written the operation, or is about to: its
	// first write is its first attempt for the shared retry budget
	// (firstWrite).
	wrote bool

	// cause is the latest reason the operation is not settled.
	cause error
	// notBefore is when the server allows the next attempt or status
	// check (its Retry-After), or zero.
	notBefore time.Time
	// maybeApplied: an attempt may have reached the server.
	maybeApplied bool
	// partial is an answer whose body broke off: the server's first word
	// on the key, which a later answer for the same key must agree with.
	partial *Response
	// proof is the status code of a success the server answered the key
	// with, its body cut (answered), this call's or journaled by an
	// earlier one (proofNote), or zero.
	proof int
	// resends is the transport's re-sends as last journaled: the next
	// write's event tells of those counted since.
	resends int
	// obs is the call's observation, when the client has hooks; unknown
	// says the outcome was unknown to this call at some point, for
	// CallEnd.Settled.
	obs     *observation
	unknown bool

	// firstRound is the memory of the call's first round (newRound): most
	// calls make one, and it costs them no allocation of its own.
	firstRound     round
	usedFirstRound bool
}

type step uint8

const (
	stepSend step = iota
	stepCheck
)

// keyForm is how the key goes on the wire: the record's form, or for a
// record journaled before forms were kept, the sending client's.
type keyForm struct {
	header string
	quoted bool
}

func (c *Client) formOf(rec Record) keyForm {
	if rec.KeyHeader == "" {
		return c.newForm()
	}
	return keyForm{rec.KeyHeader, rec.KeyQuoted}
}

// newForm is the form of the keys of operations this client creates.
func (c *Client) newForm() keyForm { return keyForm{c.keyHeader, c.cfg.QuoteKey} }

func (f keyForm) set(h http.Header, key string) { h.Set(f.header, wire.FormatKey(key, f.quoted)) }

// newDriver returns a driver for rec, which this client leases: a pending
// record is sent, an in_flight or unknown one is checked first.
func (c *Client) newDriver(rec Record) *driver {
	d := &driver{
		c: c, rec: rec, lease: rec.Lease, form: c.formOf(rec),
		deadline:     c.now().Add(c.retry.Budget),
		resends:      rec.TransportResends,
		maybeApplied: rec.State == StateInFlight || rec.State == StateUnknown,
		next:         stepSend,
		why:          "first send",
	}
	if d.maybeApplied {
		if code, _ := proofIn(rec.LastError); code != 0 {
			// An earlier call's proof: the beginning of the answer is
			// not journaled, only its status, which a later answer
			// for the key must still agree with.
			d.proof = code
			d.partial = &Response{StatusCode: code}
		}
	}
	switch {
	case rec.State != StatePending:
		d.next = stepCheck
	case rec.Attempts > 0:
		d.why = "send again: no earlier attempt reached the server"
	}
	return d
}

// run drives the operation until it is settled or this call must stop.
// It returns the Result of a settled operation, with an error matching
// ErrRejected when the server refused it.
func (d *driver) run(ctx context.Context) (*Result, error) {
	if d.c.observed {
		d.obs = observationFrom(ctx)
	}
	if d.obs != nil {
		call := &d.obs.call
		call.Key, call.Method, call.URL, call.Link = d.rec.Key, d.rec.Method, redactString(d.rec.URL), d.rec.Link
		d.unknown = d.maybeApplied
	}
	d.c.hold(d.rec.Key, d.lease)
	defer d.c.unhold(d.rec.Key)
	defer d.releaseIfActive(ctx)
	for {
		switch {
		case d.rec.State == StateSucceeded:
			return resultFrom(d.rec), nil
		case d.rec.State == StateRejected:
			return resultFrom(d.rec), opError(d.rec, d.cause)
		case d.rec.State == StateCanceled || d.rec.State == StateExpired:
			return nil, opError(d.rec, d.cause)
		case d.pastRetention():
			return nil, d.expire(ctx)
		}
		var err error
		if d.next == stepSend {
			err = d.send(ctx)
		} else {
			err = d.checkStatus(ctx)
		}
		if err != nil {
			return nil, err
		}
	}
}

// pastRetention reports whether the server may have forgotten the key. Not
// for a record about to be sent for the first time, nor after the server
// said (within retention) that it never saw the key.
func (d *driver) pastRetention() bool {
	return !d.rec.ExpiresAt.IsZero() && d.c.now().After(d.rec.ExpiresAt) && d.next == stepCheck
}

// write journals next under this driver's lease, extending the lease, with
// the event kind and detail that say why.
func (d *driver) write(ctx context.Context, next Record, dur Durability, kind EventKind, detail string) error {
	d.lease.ExpiresAt = d.c.now().Add(d.c.cfg.LeaseDuration)
	next.Lease = d.lease
	if n := next.TransportResends - d.resends; n > 0 {
		detail = joinNotes(detail, fmt.Sprintf("the transport sent it again %d time(s) by itself, on a new connection", n))
	}
	if (next.State == StateInFlight || next.State == StateUnknown) && d.answered() {
		if code, _ := proofIn(next.LastError); code == 0 {
			next.LastError = withProof(d.proof, next.LastError)
		}
		if code, _ := proofIn(d.rec.LastError); code == 0 {
			// The first write of the proof: losing it would let a later
			// call send the request again on a not_found.
			dur = Durable
		}
	}
	why := Event{Kind: kind, Detail: detail}
	stored, err := d.c.updateRecord(ctx, next, dur, why)
	if err != nil {
		return err
	}
	d.c.transition(d.rec, stored, why)
	d.rec = stored
	d.resends = stored.TransportResends
	return nil
}

// outcomeCtx is for journaling what already happened: the caller giving up
// must not keep a received answer out of the journal.
func outcomeCtx(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// send moves the operation to in_flight and sends it, retrying with the
// same key as the policy allows (see round). It returns nil to go on (to a
// status check, or settled) and an *OperationError when this call must stop.
func (d *driver) send(ctx context.Context) error {
	if d.sends >= d.c.retry.MaxAttempts {
		return d.stop(ctx, fmt.Errorf("no definitive answer after %d attempts: %w", d.sends, d.cause), d.failedDue())
	}
	if err := d.waitForServer(ctx, 0); err != nil {
		return err
	}
	rd := d.newRound(ctx)
	req, err := rd.request()
	if err != nil {
		// The request cannot even be built.
		return d.stop(ctx, err, d.failedDue())
	}
	// Authorize first: a send it stops is no attempt, and nothing of it
	// is journaled (Do's first send was journaled by its create: that
	// intent stays unsent, and the next send reuses it).
	if d.authErr = d.preauthorize(req.Request); d.authErr != nil {
		return d.unauthorized(ctx)
	}
	if d.resend {
		if !d.spend() {
			// Unknown, not pending: an earlier attempt may still arrive.
			return d.stop(ctx, fmt.Errorf("%w: %s: not sent", ErrRetryBudgetExhausted, d.why), d.failedDue())
		}
		d.resend = false
	}
	if !d.journaled {
		next := d.rec
		next.State = StateInFlight
		if !unsentIntent(d.rec) {
			next.Attempts++
		}
		next.NextAttemptAt = time.Time{}
		// The server's retention starts when it may first see the key:
		// now, for a pending operation or one the server said it never saw.
		next.ExpiresAt = d.c.now().Add(d.c.cfg.Retention)
		// From pending this is the intent to send and must be on disk
		// first; after a not_found the record already reads unknown, which
		// resumes as a status check, so losing this write is harmless.
		dur := Buffered
		if d.rec.State == StatePending {
			dur = Durable
		}
		if err := d.write(ctx, next, dur, EventSend, d.why); err != nil {
			return d.journalFailed(err)
		}
	}
	d.journaled = false
	d.next, d.why = stepCheck, ""

	last, err := rd.run(req)
	err = redactError(err)
	if rd.journalErr != nil {
		return d.journalFailed(rd.journalErr)
	}
	if rd.unauthorized != nil {
		d.authErr = rd.unauthorized
		return d.unauthorized(ctx)
	}
	if last == nil {
		// No attempt finished: the request's body could not be rewound.
		return d.stop(ctx, err, d.failedDue())
	}
	v := last.decision
	if v.Verdict == KeyConflict && last.earlierMaybeApplied {
		// The client sends nothing but the journaled request under the
		// key: when an earlier write of it may have been processed
		// (written and not answered, or answered as maybe applied), the
		// request the server holds the key for may be that write, in a
		// form the server tells apart (an Authorize that puts a fresh
		// token in the URL, a signed header). No rejection: the outcome
		// is unknown, for the status check. Earlier attempts refused
		// before processing (a 429, a connection refused) do not count:
		// nothing of them was applied, so the key is held for another
		// request, a genuine conflict, and a status check would answer
		// with that other request's result.
		d.cause = fmt.Errorf("%s, answering a re-send: the key is an earlier attempt's, which may have been applied", v.Reason)
		return d.markUnknown(ctx, v.Reason)
	}
	if v.Verdict == Succeeded || v.Verdict == Rejected || v.Verdict == KeyConflict {
		return d.settle(ctx, v, d.stored(last.resp, last.body), last.cut, EventAnswer, "")
	}
	if v.Verdict == InProgress {
		d.serverAsked(v.RetryAfter)
	}
	d.cause = errors.New(v.Reason)
	due := d.failedDue()
	if rd.stop != nil {
		d.cause = fmt.Errorf("%w; the last attempt: %s", rd.stop, v.Reason)
		if !rd.due.IsZero() {
			due = rd.due
		}
	}
	if v.Verdict == Retry && !d.maybeApplied {
		// Refused before processing, or never written: not applied.
		return d.leave(ctx, StatePending, d.cause, due, EventAnswer)
	}
	// Unknown, InProgress, RetrySameKey, or a Retry after an attempt that
	// may have reached the server: the outcome is unknown.
	if rd.stop != nil {
		return d.leave(ctx, StateUnknown, d.cause, due, EventAnswer)
	}
	return d.markUnknown(ctx, v.Reason)
}

// unauthorized ends the call after Config.Authorize failed (authErr) on
// a send: pending when nothing of the operation may have reached the
// server, else unknown. Another try now would fail the same way; the next
// Do, or a Resume once it is due, runs Authorize again.
func (d *driver) unauthorized(ctx context.Context) error {
	state := StatePending
	if d.maybeApplied {
		state = StateUnknown
	}
	d.cause, d.authErr = d.authErr, nil
	if d.journaled {
		// Do's create journaled this send as attempt 1: it stays unsent,
		// and the next send reuses it (unsentIntent).
		d.cause = unsentError{d.cause}
	}
	return d.leave(ctx, state, d.cause, d.failedDue(), EventStop)
}

// serverAsked records a wait the server asked for (Retry-After).
func (d *driver) serverAsked(wait time.Duration) {
	if wait > 0 {
		d.notBefore = later(d.notBefore, d.c.now().Add(wait))
	}
}

// waitForServer waits at least min, and until the server allows the next
// try if it asked for a wait this call may spend; otherwise it ends the
// call, with the operation due again at the server's time.
func (d *driver) waitForServer(ctx context.Context, least time.Duration) error {
	server := d.notBefore.Sub(d.c.now())
	if server > d.c.retry.MaxRetryAfter {
		return d.stop(ctx, fmt.Errorf("the server asked to wait %s (Retry-After), longer than RetryPolicy.MaxRetryAfter (%s): due again then",
			server.Round(time.Second), d.c.retry.MaxRetryAfter), d.notBefore)
	}
	switch {
	case server > least:
		return d.sleep(ctx, server, "the server's Retry-After")
	case least > 0:
		return d.sleep(ctx, least, "the backoff")
	}
	return nil
}

// sleep waits d unless the wait would run past the context's deadline or
// this call's budget, in which case it ends the call with the operation due
// again when the wait would have ended. The error says both why the call
// stopped and why the operation was not settled before.
func (d *driver) sleep(ctx context.Context, wait time.Duration, what string) error {
	until := d.c.now().Add(wait)
	var why error
	if dl, ok := ctx.Deadline(); ok && until.After(dl) {
		why = fmt.Errorf("%w: the wait for %s (%s) would end after the context's deadline",
			context.DeadlineExceeded, what, wait.Round(time.Millisecond))
	} else if until.After(d.deadline) && !d.waitsForDeadline(ctx) {
		why = fmt.Errorf("the wait for %s (%s) would end after this call's budget of %s (RetryPolicy.Budget)",
			what, wait.Round(time.Millisecond), d.c.retry.Budget)
	} else if err := sleep(ctx, wait); err != nil {
		why = err
	}
	if why == nil {
		return nil
	}
	if d.cause != nil {
		why = fmt.Errorf("%w; before that: %w", why, d.cause)
	}
	return d.stop(ctx, why, until)
}

// waitsForDeadline reports whether the wait for a server that says it is
// still processing the key is bounded by the caller's deadline alone, not
// by RetryPolicy.MaxStatusChecks nor Budget: a caller who gave a deadline
// said how long the answer is worth waiting for. Resume's calls keep the
// count: one operation must not hold a worker for the whole pass.
func (d *driver) waitsForDeadline(ctx context.Context) bool {
	_, ok := ctx.Deadline()
	return ok && d.callersDeadline && d.cause == errProcessing
}

// stored turns a response into what the journal keeps: no Set-Cookie, no
// secret header.
func (d *driver) stored(resp *http.Response, body []byte) *Response {
	// The answer is this attempt's, read to its end: its header is ours to
	// keep, and the journal copies what it keeps.
	h := resp.Header
	d.c.dropSecrets(h)
	return &Response{StatusCode: resp.StatusCode, Header: h, Body: body, Replayed: wire.Replayed(resp.Header)}
}

// dropSecrets removes Set-Cookie and the secret headers from h, whatever
// case their names are spelled in, and writes every other name in its
// canonical form, merging the spellings of one name. It is the one rule for
// every answer the client keeps: an attempt's (net/http's names are
// canonical, a custom RoundTripper's need not be) and a status checker's
// (StatusEndpoint's JSON, a StatusAdapter's Decode, whose names are
// whatever the server or the decoder wrote). Header.Del matches canonical
// names only: "set-cookie" would stay, and be journaled in clear. A name
// that is no HTTP token is dropped too: no server sent it as a header, and
// it may be a secret under a spelling no rule can match ("x-token ", or
// "Trailer:X-Token", the form a server middleware keeps a trailer in,
// which an answer received directly never has in its header either).
func (c *Client) dropSecrets(h http.Header) {
	var odd []string
	for name := range h {
		switch {
		case c.secretHeader(name), !wire.IsToken(name):
			delete(h, name)
		case http.CanonicalHeaderKey(name) != name:
			odd = append(odd, name)
		}
	}
	// Sorted, so that the values of a name spelled several ways are merged
	// in one order, whatever the map's.
	slices.Sort(odd)
	for _, name := range odd {
		values := h[name]
		delete(h, name)
		if canon := http.CanonicalHeaderKey(name); !c.secretHeader(canon) {
			h[canon] = append(h[canon][:len(h[canon]):len(h[canon])], values...)
		}
	}
}

// settle records a definitive answer. A success is committed before Do
// returns, without waiting for its fsync (Deferred): a crash of the process
// keeps it, and a power cut that loses it leaves the record in_flight or
// unknown, for a status check to return the same answer, which the server
// keeps. (Buffering it, uncommitted until the next write, was measured
// about 8 % faster at best, short of what losing it on an exit without
// Close would be worth; see BENCHMARKS.md.) A rejection is durable: a
// server need not keep a request it refused, so a status check could
// answer not_found and a resume would send the request again, after this
// call reported it rejected.
func (d *driver) settle(ctx context.Context, v Decision, resp *Response, cut bool, kind EventKind, detail string) error {
	next := d.rec
	next.State = StateSucceeded
	next.LastError = ""
	d.cause = nil
	if v.Verdict != Succeeded {
		next.State = StateRejected
		next.LastError = v.Reason
		d.cause = errors.New(v.Reason)
	}
	if v.Verdict == KeyConflict {
		next.LastError = conflictNote + v.Reason
		d.cause = fmt.Errorf("%w: %s", ErrKeyConflict, v.Reason)
	}
	next.Response = resp
	next.NextAttemptAt = time.Time{}
	if cut {
		note := fmt.Sprintf(bodyCutNote+"%d bytes"+bodyCutEnd, d.c.cfg.MaxResponseBytes)
		next.LastError = joinNotes(next.LastError, note)
	}
	dur := Deferred
	if next.State == StateRejected {
		dur = Durable
	}
	if err := d.write(outcomeCtx(ctx), next, dur, kind, detail); err != nil {
		return d.journalFailed(err)
	}
	if d.obs != nil && d.unknown {
		d.obs.end.Settled = SettledByResend
		if kind == EventStatus {
			d.obs.end.Settled = SettledByStatusCheck
		}
	}
	return nil
}

func joinNotes(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// markUnknown records that the outcome is unknown, and why.
func (d *driver) markUnknown(ctx context.Context, reason string) error {
	d.unknown = true
	next := d.rec
	next.State = StateUnknown
	next.LastError = d.cause.Error()
	if err := d.write(outcomeCtx(ctx), next, Buffered, EventAnswer, reason); err != nil {
		return d.journalFailed(err)
	}
	return nil
}

// failedDue is when an operation this call leaves unsettled is due for
// Resume: after a backoff when the server or the network failed it, so that
// Resume does not spin on it; at once when the call was merely interrupted
// (its context ended, or the client was closed), so that a process that
// restarts right away resumes it; never before the server's Retry-After.
func (d *driver) failedDue() time.Time {
	return later(d.c.now().Add(d.c.retry.MaxBackoff), d.notBefore)
}

// leave ends this call with the operation journaled in state, cause as its
// LastError, due again at due (at once if the call's context ended, but
// never before the server's Retry-After), and returns the *OperationError
// that says so. An operation left pending carries no retention clock: no
// attempt of it was written (or every one was refused before processing),
// so the server has not seen the key.
func (d *driver) leave(ctx context.Context, state State, cause error, due time.Time, kind EventKind) error {
	if ctx.Err() != nil {
		due = later(d.c.now(), d.notBefore)
	}
	next := d.rec
	next.State = state
	if cause != nil {
		next.LastError = cause.Error()
	}
	if state.Active() {
		next.NextAttemptAt = due
	}
	if state == StatePending {
		next.ExpiresAt = time.Time{}
	}
	detail := ""
	if state.Active() {
		detail = "due again at " + due.UTC().Format("2006-01-02T15:04:05.000Z")
		if !d.notBefore.IsZero() && !due.After(d.notBefore) {
			detail += " (the server's Retry-After)"
		}
	}
	// Buffered: if a crash loses this, the record reads as the last
	// durable write left it (in_flight), which resumes as a status check:
	// slower, never wrong.
	if err := d.write(outcomeCtx(ctx), next, Buffered, kind, detail); err != nil {
		return d.journalFailed(err)
	}
	return opError(d.rec, cause)
}

// stop ends this call with the operation where it is. An in_flight record
// becomes unknown: no attempt of this driver is on the wire any more, and
// whether the last one arrived is what the next status check must tell.
func (d *driver) stop(ctx context.Context, cause error, due time.Time) error {
	if cause == nil {
		cause = d.cause
	}
	if !d.rec.State.Active() {
		return opError(d.rec, cause)
	}
	state := d.rec.State
	if state == StateInFlight {
		state = StateUnknown
	}
	return d.leave(ctx, state, cause, due, EventStop)
}

// expire parks an operation whose server retention passed without a
// confirmed outcome, for an operator.
func (d *driver) expire(ctx context.Context) error {
	cause := fmt.Errorf("the server's key retention (%s) ended at %s before the outcome was confirmed; not re-sent",
		d.c.cfg.Retention, d.rec.ExpiresAt.UTC().Format(time.RFC3339))
	return d.park(ctx, cause, Buffered)
}

// park moves the operation to expired, for an operator, and returns the
// *OperationError that says so.
func (d *driver) park(ctx context.Context, cause error, dur Durability) error {
	next := d.rec
	next.State = StateExpired
	next.LastError = cause.Error()
	if errors.Is(cause, ErrKeyNotHonoured) && !strings.HasPrefix(next.LastError, notHonouredNote) {
		next.LastError = notHonouredNote + next.LastError
	}
	next.NextAttemptAt = time.Time{}
	if err := d.write(outcomeCtx(ctx), next, dur, EventExpire, ""); err != nil {
		return d.journalFailed(err)
	}
	if d.obs != nil {
		d.obs.end.Expired = true
	}
	return opError(d.rec, cause)
}

// agrees reports whether a complete answer can be the one whose beginning
// was seen: the same status, and a body that starts with what arrived.
func agrees(partial, full *Response) bool {
	return partial.StatusCode == full.StatusCode && len(full.Body) >= len(partial.Body) &&
		string(full.Body[:len(partial.Body)]) == string(partial.Body)
}

// keyNotHonoured handles a server that answered one key twice with
// different results: it executed the request again, so it does not keep
// idempotency keys, and the operation may have been applied twice. Nothing
// more is sent: the operation is parked as expired, for an operator to
// check the business records and Reconcile.
func (d *driver) keyNotHonoured(ctx context.Context, second *Response) error {
	cause := fmt.Errorf("%w: key %s was answered HTTP %d, then HTTP %d with a different body; the request may have been applied twice: check for a duplicate, then Reconcile",
		ErrKeyNotHonoured, d.rec.Key, d.partial.StatusCode, second.StatusCode)
	// Durable: losing this would let a resume replay the key once more.
	return d.park(ctx, cause, Durable)
}

// journalFailed reports a journal write that failed: the operation is
// where the journal last had it.
func (d *driver) journalFailed(err error) error {
	if d.lease.Owner == d.c.owner {
		d.c.leave(d.rec.Key) // the write's answer may have been lost after it committed
	}
	return opError(d.rec, fmt.Errorf("journal: %w", err))
}

func (d *driver) releaseIfActive(ctx context.Context) {
	if !d.rec.State.Active() || d.lease.Owner == "" {
		return
	}
	if err := d.c.journal.Release(outcomeCtx(ctx), d.rec.Key, d.lease); err != nil && !errors.Is(err, ErrLeaseLost) {
		d.c.log.Warn("idem: releasing a lease failed", "key", d.rec.Key, "error", err)
	}
}

// later returns the later of two times.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// cmpErr returns the first non-nil error.
func cmpErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
