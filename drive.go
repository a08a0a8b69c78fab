package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idem/internal/wire"
)

// A driver takes one leased operation as far as one call may: it sends it
// (go-retryablehttp's loop makes the attempts, with this driver's
// CheckRetry, Backoff and hooks), checks its status when its outcome is
// unknown, and journals every step. A driver is used by one goroutine.
type driver struct {
	c     *Client
	rec   Record // the journal's copy, as last written or read
	lease Lease  // the lease this driver writes under

	// sendNow: the record was just created in_flight by Do and not sent.
	sendNow bool
	// resend: the status check said not_found: send again, same key.
	resend bool
	// maybeApplied: some attempt may have reached the server.
	maybeApplied bool

	deadline     time.Time // end of this call's budget
	sends        int       // attempts this call
	statusChecks int       // status checks this call
	statusWait   time.Duration

	// the attempt in progress and the last one finished
	written atomic.Bool
	writes  atomic.Int32 // times the attempt was written: the transport may re-send
	last    Attempt
	verdict Decision
	cut     bool // the last body was cut at MaxResponseBytes
	// partial is an answer whose body broke off: the server's first word on
	// the key, which a later answer for the same key must agree with.
	partial *Response
	wait    time.Duration
	gaveUp  error // why no further attempt was made
	cause   error // the latest reason the operation is not settled
	// journalErr: the journal refused the write before a retry.
	journalErr error
}

func (c *Client) newDriver(rec Record) *driver {
	return &driver{
		c: c, rec: rec, lease: rec.Lease,
		deadline:     c.now().Add(c.retry.Budget),
		maybeApplied: rec.State == StateInFlight || rec.State == StateUnknown,
	}
}

// run drives the operation until it is settled or this call must stop.
func (d *driver) run(ctx context.Context) (*Result, error) {
	defer d.releaseIfActive(ctx)
	for {
		switch {
		case d.rec.State == StateCanceled || d.rec.State == StateExpired:
			return nil, opError(d.rec, nil)
		case d.rec.State.Terminal():
			return resultFrom(d.rec), nil
		case d.pastRetention():
			return nil, d.expire(ctx)
		}
		var err error
		if d.sendNow || d.resend || d.rec.State == StatePending {
			err = d.sendRound(ctx)
		} else {
			err = d.statusRound(ctx)
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
	return !d.rec.ExpiresAt.IsZero() && d.c.now().After(d.rec.ExpiresAt) && !d.sendNow && !d.resend
}

// update journals next under this driver's lease, extending the lease.
func (d *driver) update(ctx context.Context, next Record, dur Durability) error {
	d.lease.ExpiresAt = d.c.now().Add(d.c.cfg.LeaseDuration)
	next.Lease = d.lease
	stored, err := d.c.journal.Update(ctx, next, dur)
	if err != nil {
		return err
	}
	d.c.transition(d.rec, stored)
	d.rec = stored
	return nil
}

// outcomeCtx is for journaling what already happened: the caller giving up
// must not keep a received answer out of the journal.
func outcomeCtx(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// sendRound moves the operation to in_flight and sends it, retrying with the
// same key as the policy allows. It returns nil to go on to a status check
// (the outcome is unknown) or when the operation is settled, and an
// *OperationError when this call must stop.
func (d *driver) sendRound(ctx context.Context) error {
	if !d.sendNow {
		if d.sends >= d.c.retry.MaxAttempts {
			return d.stop(ctx, d.gaveUp)
		}
		next := d.rec
		next.State = StateInFlight
		next.Attempts++
		next.LastError = ""
		// The server's retention starts when it may first see the key: now,
		// for a pending operation or one the server said it never saw.
		next.ExpiresAt = d.c.now().Add(d.c.cfg.Retention)
		// From pending this is the intent to send and must be on disk
		// first; after a not_found the record already reads unknown, which
		// resumes as a status check, so losing this write is harmless.
		dur := Buffered
		if d.rec.State == StatePending {
			dur = Durable
		}
		if err := d.update(ctx, next, dur); err != nil {
			return d.journalFailed(err)
		}
	}
	d.sendNow, d.resend = false, false
	d.gaveUp = nil

	req, err := d.request(ctx)
	if err != nil {
		return d.stop(ctx, err)
	}
	rc := &retryablehttp.Client{
		HTTPClient:     d.c.http,
		RetryMax:       math.MaxInt32, // CheckRetry enforces the policy
		CheckRetry:     d.checkRetry,
		Backoff:        d.backoff,
		RequestLogHook: d.beforeAttempt,
		PrepareRetry:   d.prepareRetry,
		ErrorHandler:   retryablehttp.PassthroughErrorHandler,
	}
	before := d.sends
	d.partial = nil
	resp, err := rc.Do(req)
	if resp != nil {
		resp.Body.Close()
	}
	if d.sends == before {
		// No attempt finished: the request could not even be prepared.
		return d.stop(ctx, err)
	}
	if d.journalErr != nil {
		return d.journalFailed(d.journalErr)
	}
	if ctx.Err() != nil {
		d.gaveUp = ctx.Err()
	}
	v := d.verdict
	switch v.Verdict {
	case Succeeded, Rejected, KeyConflict:
		return d.settle(ctx, v, d.stored(d.last.Response, d.last.Body))
	case Retry:
		if !d.maybeApplied {
			return d.leave(ctx, StatePending, cmpErr(d.gaveUp, errors.New(v.Reason)), Buffered)
		}
	case InProgress:
		d.statusWait = min(v.RetryAfter, d.c.retry.MaxRetryAfter)
	}
	// Unknown, InProgress, RetrySameKey, or a Retry after an attempt that
	// may have reached the server: the outcome is unknown.
	d.cause = errors.New(v.Reason)
	if d.gaveUp != nil {
		return d.leave(ctx, StateUnknown, d.gaveUp, Buffered)
	}
	return d.markUnknown(ctx)
}

// request builds the attempt: the journaled method, URL, headers and body,
// the key header, and a trace that records whether the request was written.
func (d *driver) request(ctx context.Context) (*retryablehttp.Request, error) {
	trace := &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				d.written.Store(true)
				d.writes.Add(1)
			}
		},
	}
	req, err := retryablehttp.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), d.rec.Method, d.rec.URL, d.rec.Body)
	if err != nil {
		return nil, fmt.Errorf("idem: building the journaled request: %w", err)
	}
	d.setHeaders(req.Header)
	return req, nil
}

func (d *driver) setHeaders(h http.Header) {
	for k, v := range d.rec.Header {
		h[k] = append([]string(nil), v...)
	}
	h.Set(d.c.keyHeader, wire.FormatKey(d.rec.Key, d.c.cfg.QuoteKey))
}

// beforeAttempt is retryablehttp's RequestLogHook: it runs before every
// attempt.
func (d *driver) beforeAttempt(_ retryablehttp.Logger, _ *http.Request, _ int) {
	d.written.Store(false)
	d.writes.Store(0)
}

// checkRetry is retryablehttp's CheckRetry: it reads the body, classifies
// the attempt, and decides whether another attempt may start: only for a
// Retry or RetrySameKey verdict, within MaxAttempts, the call's budget, the
// context's deadline (no wait runs past it) and the shared retry budget.
func (d *driver) checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	d.sends++
	a := Attempt{Err: err, Written: d.written.Load()}
	if extra := int(d.writes.Load()) - 1; extra > 0 {
		// net/http re-sent the request on a new connection after a reused
		// one died (it does so for requests with an Idempotency-Key): count
		// those sends too; the next journal write records them. The
		// connection died after an earlier write and before any reply: the
		// server may have applied that write, whatever the last one got
		// (a 429 answers the re-send, not the write that was lost).
		d.rec.Attempts += extra
		d.maybeApplied = true
		d.c.log.Debug("idem: the transport re-sent the request", "key", d.rec.Key, "times", extra)
	}
	d.cut = false
	if resp != nil {
		body, cut, rerr := readBody(resp.Body, d.c.cfg.MaxResponseBytes)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		a.Response, a.Body, d.cut = resp, body, cut
		if rerr != nil {
			a.Err = rerr
			d.partial = &Response{StatusCode: resp.StatusCode, Body: body}
		}
	}
	d.last = a
	d.verdict = d.c.classify(a)
	if d.sends == 1 {
		d.c.budget.deposit()
	}
	if a.Written && d.verdict.Verdict != Retry {
		d.maybeApplied = true
	}
	d.c.log.Debug("idem: attempt", "key", d.rec.Key, "scope", d.rec.Scope, "id", d.rec.ID,
		"attempt", d.rec.Attempts, "written", a.Written, "verdict", d.verdict.Verdict.String(), "reason", d.verdict.Reason)
	if v := d.verdict.Verdict; (v != Retry && v != RetrySameKey) || ctx.Err() != nil {
		return false, nil
	}
	if d.sends >= d.c.retry.MaxAttempts {
		d.gaveUp = fmt.Errorf("gave up after %d attempts: %s", d.sends, d.verdict.Reason)
		return false, nil
	}
	wait := min(d.verdict.RetryAfter, d.c.retry.MaxRetryAfter)
	if wait <= 0 {
		wait = d.c.retry.backoff(d.sends)
	}
	start := d.c.now().Add(wait)
	if dl, ok := ctx.Deadline(); ok && start.After(dl) {
		d.gaveUp = fmt.Errorf("%w: the next attempt would start after the context's deadline: %s", context.DeadlineExceeded, d.verdict.Reason)
		return false, nil
	}
	if start.After(d.deadline) {
		d.gaveUp = fmt.Errorf("retry budget of %s for this call spent: %s", d.c.retry.Budget, d.verdict.Reason)
		return false, nil
	}
	if !d.c.budget.withdraw() {
		d.gaveUp = fmt.Errorf("%w: %s", ErrRetryBudgetExhausted, d.verdict.Reason)
		return false, nil
	}
	d.wait = wait
	return true, nil
}

// backoff is retryablehttp's Backoff: checkRetry has already chosen the wait.
func (d *driver) backoff(_, _ time.Duration, _ int, _ *http.Response) time.Duration { return d.wait }

// prepareRetry is retryablehttp's PrepareRetry: it journals the attempt
// about to start. The record is already in_flight, so this is buffered; a
// lost lease stops the loop.
func (d *driver) prepareRetry(req *http.Request) error {
	next := d.rec
	next.Attempts++
	next.LastError = d.verdict.Reason
	d.journalErr = d.update(outcomeCtx(req.Context()), next, Buffered)
	return d.journalErr
}

// stored turns a response into what the journal keeps: no Set-Cookie, no
// secret header.
func (d *driver) stored(resp *http.Response, body []byte) *Response {
	h := resp.Header.Clone()
	for _, name := range d.c.secrets {
		h.Del(name)
	}
	return &Response{StatusCode: resp.StatusCode, Header: h, Body: body, Replayed: wire.Replayed(resp.Header)}
}

// settle records a definitive answer. A success is buffered (unless
// Config.CommitOutcomes): if it is lost, the record reads in_flight or
// unknown and a status check returns the same answer, which the server
// keeps. A rejection is durable: a server need not keep a request it
// refused, so a status check could answer not_found and a resume would
// send the request again, after this call reported it rejected.
func (d *driver) settle(ctx context.Context, v Decision, resp *Response) error {
	next := d.rec
	next.State = StateSucceeded
	if v.Verdict != Succeeded {
		next.State = StateRejected
	}
	next.Response = resp
	next.LastError = ""
	if v.Verdict == KeyConflict {
		next.LastError = v.Reason
	}
	if d.cut {
		next.LastError = fmt.Sprintf("response body cut at %d bytes (Config.MaxResponseBytes)", d.c.cfg.MaxResponseBytes)
	}
	dur := Buffered
	switch {
	case next.State == StateRejected:
		dur = Durable
	case d.c.cfg.CommitOutcomes:
		dur = Deferred
	}
	if err := d.update(outcomeCtx(ctx), next, dur); err != nil {
		return d.journalFailed(err)
	}
	if v.Verdict == KeyConflict {
		e := opError(d.rec, errors.New(v.Reason))
		e.conflict = true
		return e
	}
	return nil
}

// markUnknown records that the outcome is unknown.
func (d *driver) markUnknown(ctx context.Context) error {
	if d.rec.State == StateUnknown && d.rec.LastError == d.cause.Error() {
		return nil
	}
	next := d.rec
	next.State = StateUnknown
	next.LastError = d.cause.Error()
	if err := d.update(outcomeCtx(ctx), next, Buffered); err != nil {
		return d.journalFailed(err)
	}
	return nil
}

// dueAgain is when an operation this call leaves unsettled is due for
// Resume: after a backoff when the server or the network failed it, so that
// Resume does not spin on it; at once when the call was merely interrupted
// (its context ended, or the client was closed), so that a process that
// restarts right away resumes it.
func (d *driver) dueAgain(ctx context.Context) time.Time {
	if ctx.Err() != nil {
		return d.c.now()
	}
	return d.c.now().Add(d.c.retry.MaxBackoff)
}

// leave ends this call with the operation journaled in state, cause as its
// LastError, and returns the *OperationError that says so. An operation
// left active is due again for Resume (see dueAgain); one left pending
// carries no retention clock: no attempt of it was written (or every one
// was refused before processing), so the server has not seen the key.
func (d *driver) leave(ctx context.Context, state State, cause error, dur Durability) error {
	next := d.rec
	next.State = state
	if cause != nil {
		next.LastError = cause.Error()
	}
	if state.Active() {
		next.NextAttemptAt = d.dueAgain(ctx)
	}
	if state == StatePending {
		next.ExpiresAt = time.Time{}
	}
	if err := d.update(outcomeCtx(ctx), next, dur); err != nil {
		return d.journalFailed(err)
	}
	return opError(d.rec, cause)
}

// stop ends this call with the operation where it is. An in_flight record
// becomes unknown: no attempt of this driver is on the wire any more, and
// whether the last one arrived is what the next status check must tell.
func (d *driver) stop(ctx context.Context, cause error) error {
	cause = cmpErr(cause, d.cause)
	if !d.rec.State.Active() {
		return opError(d.rec, cause)
	}
	state := d.rec.State
	if state == StateInFlight {
		state = StateUnknown
	}
	return d.leave(ctx, state, cause, Buffered)
}

// expire parks an operation whose server retention passed without a
// confirmed outcome, for an operator.
func (d *driver) expire(ctx context.Context) error {
	return d.leave(ctx, StateExpired, fmt.Errorf("the server's key retention (%s) ended at %s before the outcome was confirmed; not re-sent",
		d.c.cfg.Retention, d.rec.ExpiresAt.UTC().Format(time.RFC3339)), Buffered)
}

// agrees reports whether a complete answer can be the one whose beginning
// was seen: the same status, and a body that starts with what arrived.
func agrees(partial, full *Response) bool {
	return partial.StatusCode == full.StatusCode && bytes.HasPrefix(full.Body, partial.Body)
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
	return d.leave(ctx, StateExpired, cause, Durable)
}

// journalFailed reports a journal write that failed: the operation is
// where the journal last had it.
func (d *driver) journalFailed(err error) error {
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

// statusRound asks the server what became of the operation until it
// answers definitively, says it never saw the key, or this call must stop.
func (d *driver) statusRound(ctx context.Context) error {
	wait := d.statusWait
	d.statusWait = 0
	for {
		if d.statusChecks >= d.c.retry.MaxStatusChecks {
			return d.stop(ctx, cmpErr(d.gaveUp, fmt.Errorf("no definitive status after %d checks: %w", d.statusChecks, d.cause)))
		}
		if wait > 0 {
			start := d.c.now().Add(wait)
			if dl, ok := ctx.Deadline(); ok && start.After(dl) {
				return d.stop(ctx, fmt.Errorf("%w: the next status check would start after the context's deadline", context.DeadlineExceeded))
			}
			if start.After(d.deadline) {
				return d.stop(ctx, fmt.Errorf("budget of %s for this call spent checking status", d.c.retry.Budget))
			}
			if err := sleep(ctx, wait); err != nil {
				return d.stop(ctx, err)
			}
		}
		if d.pastRetention() {
			return d.expire(ctx)
		}
		d.statusChecks++
		st, err := d.c.status.CheckStatus(ctx, d.query())
		if err != nil {
			d.cause = err
			if ctx.Err() != nil {
				return d.stop(ctx, ctx.Err())
			}
			wait = d.c.retry.backoff(d.statusChecks)
			continue
		}
		switch st.State {
		case StatusCompleted:
			if st.Response == nil {
				d.cause = errors.New("status checker said completed without a response")
				break
			}
			resp := st.Response
			if d.partial != nil && !agrees(d.partial, resp) {
				return d.keyNotHonoured(ctx, resp)
			}
			v := d.c.classify(Attempt{Response: &http.Response{StatusCode: resp.StatusCode, Header: resp.Header}, Body: resp.Body, Written: true})
			switch v.Verdict {
			case Succeeded, KeyConflict:
			default:
				// The server's stored answer is final for the key,
				// whatever it is.
				v.Verdict = Rejected
			}
			resp.Header = resp.Header.Clone()
			for _, name := range d.c.secrets {
				resp.Header.Del(name)
			}
			d.cut = false
			return d.settle(ctx, v, resp)
		case StatusNotFound:
			// The server has not seen the key yet: send it again, same
			// key. An earlier attempt may still be on its way (held in a
			// gateway, delayed in the network) and arrive after this
			// answer, so the operation stays maybe applied: should the
			// re-send be refused, it is unknown, not pending.
			d.resend = true
			return nil
		case StatusProcessing:
			d.cause = errors.New("the server is still processing the key")
			wait = max(min(st.RetryAfter, d.c.retry.MaxRetryAfter), d.c.retry.backoff(d.statusChecks))
			continue
		default:
			d.cause = fmt.Errorf("status checker answered %v", st.State)
		}
		wait = d.c.retry.backoff(d.statusChecks)
	}
}

func (d *driver) query() StatusQuery {
	return StatusQuery{
		Record: d.rec,
		Do: func(req *http.Request) (*http.Response, error) {
			req.Header.Set(d.c.keyHeader, wire.FormatKey(d.rec.Key, d.c.cfg.QuoteKey))
			return d.c.http.Do(req)
		},
		Request: func(ctx context.Context) (*http.Request, error) {
			req, err := http.NewRequestWithContext(ctx, d.rec.Method, d.rec.URL, bytes.NewReader(d.rec.Body))
			if err != nil {
				return nil, err
			}
			d.setHeaders(req.Header)
			return req, nil
		},
		Classify:         d.c.classify,
		MaxResponseBytes: d.c.cfg.MaxResponseBytes,
	}
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
