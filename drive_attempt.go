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
	"slices"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idem/internal/wire"
)

// A round is one run of go-retryablehttp's loop over the journaled request:
// attempts of the same bytes under the same key, retried as the verdicts
// allow. go-retryablehttp owns the loop, the waits, the rewinding of the
// body and the closing of what each attempt leaves; the round's hooks
// decide. Each attempt reads top to bottom:
//
//	beforeAttempt  (RequestLogHook)  a new attempt starts
//	the transport  (httptrace)       counts the times the request is written
//	checkRetry     (CheckRetry)      reads the answer, classifies it, and
//	                                 plans: stop, or retry after a wait
//	backoff        (Backoff)         returns the wait checkRetry chose
//	prepareRetry   (PrepareRetry)    journals the next attempt, fenced by
//	                                 the lease, before it is sent
//
// The hooks run on the goroutine that called send, one after another; only
// the trace runs on the transport's goroutines, hence the atomics. They are
// the client's (see newSender), allocated once: each finds its round from
// the request's context, the round's opCtx, which every hook but Backoff
// is given. Backoff is given no request when there is no response, so the
// wait is PrepareRetry's.
type round struct {
	d   *driver
	ctx context.Context
	cur atomic.Pointer[attempt]
	// trace counts the attempts' writes and op is their requests' context:
	// fields, not allocations of their own.
	trace httptrace.ClientTrace
	op    opCtx
	// req is the round's request (request).
	req retryablehttp.Request

	// last is the last attempt that finished.
	last *attempt
	// wait is the wait checkRetry chose before the next attempt.
	wait time.Duration
	// stop says why no further attempt was made although the verdict
	// allowed one (attempts, budget, deadline, the shared retry budget);
	// due is then when the operation is due again, or zero for the
	// driver's default.
	stop error
	due  time.Time
	// journalErr: the journal refused to record the next attempt (a lost
	// lease, a full disk): nothing more may be sent.
	journalErr error
	// unauthorized: Config.Authorize failed, so the last attempt was not
	// sent and the round stopped.
	unauthorized *authorizeError

	// firstAttempt is the memory of the round's first attempt, as
	// driver.firstRound is the first round's.
	firstAttempt     attempt
	usedFirstAttempt bool
}

// An attempt is one send of the request and what came back.
type attempt struct {
	// written and writes are set by the transport's trace: whether the
	// request's headers were written, and how many times (net/http may
	// write it again on a new connection when a reused one dies before any
	// reply). Headers written is where "the server may have it" starts: a
	// server may answer, and act, before it has read the body, and a write
	// error on the body then hides its answer.
	written atomic.Bool
	writes  atomic.Int32
	// traced is set by the trace's GetConn, which net/http calls before it
	// takes or dials a connection: the transport saw the attempt's trace,
	// so a written that stayed false means nothing was written. Without
	// it, a transport that sends a request of its own built from the
	// attempt's (as signing and proxying RoundTrippers do) leaves the
	// trace silent whatever it wrote. Only set for a transport that is
	// not known to trace (Client.traces).
	traced atomic.Bool
	// notCalled: the attempt's context had ended before the transport was
	// called (see notCalled), which was therefore not.
	notCalled bool

	sent     bytes.Reader   // the reader of the request's body
	start    time.Time      // when it started, for the Attempt hook
	resp     *http.Response // nil when err says why there is none
	body     []byte
	cut      bool  // the body was longer than MaxResponseBytes
	err      error // the transport's error, or the body's when it broke off
	decision Decision
	// earlierMaybeApplied: before this attempt's answer, a write of the
	// operation may have been processed (an earlier call's, round's or
	// attempt's, or a write of this one the transport re-sent), as
	// driver.maybeApplied then said. A key conflict answering this
	// attempt names that write only then.
	earlierMaybeApplied bool
}

func (d *driver) newRound(ctx context.Context) *round {
	if !d.usedFirstRound {
		d.usedFirstRound = true
		rd := &d.firstRound
		rd.d, rd.ctx = d, ctx
		return rd
	}
	return &round{d: d, ctx: ctx}
}

// run sends req, the journaled request (see request), until an attempt's
// verdict is final or the plan says stop. It returns the last attempt that
// finished, or nil and the error when none did.
func (rd *round) run(req *retryablehttp.Request) (*attempt, error) {
	resp, err := rd.d.c.sender.Do(req)
	if resp != nil {
		resp.Body.Close()
	}
	if rd.last != nil && rd.stop == nil && rd.ctx.Err() != nil && rd.last.decision.Verdict.retryable() {
		// The context ended during the wait before the next attempt.
		rd.stop = rd.ctx.Err()
	}
	return rd.last, err
}

// request builds the attempt: the journaled method, URL, headers and body,
// the key in the record's form, the operation for Authorize, and a trace
// that records whether (and how often) the request was written.
//
// The body is the attempt's own (beforeAttempt gives each its reader), not
// go-retryablehttp's: its rewinding would cost each call two closures and
// two readers more, for bytes that are already in memory.
func (rd *round) request() (*retryablehttp.Request, error) {
	d := rd.d
	rd.trace.WroteHeaders = rd.wroteHeaders
	if !d.c.traces {
		// A closure more, for a transport that may not trace.
		rd.trace.GetConn = rd.getConn
	}
	ctx := d.withOperation(&rd.op, httptrace.WithClientTrace(rd.ctx, &rd.trace), false)
	rd.op.rd = rd
	req, err := http.NewRequestWithContext(ctx, d.rec.Method, d.rec.URL, nil)
	if err != nil {
		return nil, fmt.Errorf("idem: building the journaled request: %w", err)
	}
	// No body is no body, not an empty one: net/http sends an empty body
	// of a POST chunked, and a server that watches the connection only
	// once the handler has read the body never sees such a request end.
	if body := d.rec.Body; len(body) > 0 {
		req.ContentLength = int64(len(body))
		// For the transport's own re-send on a new connection, and a
		// redirect's.
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	d.setHeaders(req.Header)
	rd.req = retryablehttp.Request{Request: req}
	return &rd.req, nil
}

// wroteHeaders is the trace's WroteHeaders: the current attempt's.
func (rd *round) wroteHeaders() {
	if a := rd.cur.Load(); a != nil {
		a.wrote()
	}
}

// getConn is the trace's GetConn: the current attempt reached a
// transport that traces it.
func (rd *round) getConn(string) {
	if a := rd.cur.Load(); a != nil {
		a.traced.Store(true)
	}
}

// setHeaders sets the journaled headers and the key, in the record's form:
// copies, all in one array as http.Header.Clone makes them, each value
// slice capped so that an append to one never writes into the next.
func (d *driver) setHeaders(h http.Header) {
	n := 1
	for _, v := range d.rec.Header {
		n += len(v)
	}
	vals := make([]string, 0, n)
	for k, v := range d.rec.Header {
		if len(v) == 0 {
			h[k] = nil
			continue
		}
		vals = append(vals, v...)
		h[k] = vals[len(vals)-len(v) : len(vals) : len(vals)]
	}
	vals = append(vals, wire.FormatKey(d.rec.Key, d.form.quoted))
	name := d.form.header
	if name != d.c.keyHeader { // the client's is canonical already (New)
		name = http.CanonicalHeaderKey(name)
	}
	h[name] = vals[len(vals)-1:]
}

// newSender returns the client's go-retryablehttp client, which sends
// every round's attempts over attempts; its hooks are the round's, found
// in the request's context (roundOf).
func newSender(attempts *http.Client) *retryablehttp.Client {
	return &retryablehttp.Client{
		HTTPClient: attempts,
		RetryMax:   math.MaxInt32, // checkRetry enforces the policy
		CheckRetry: func(ctx context.Context, resp *http.Response, err error) (bool, error) {
			return roundOf(ctx).checkRetry(ctx, resp, err)
		},
		Backoff: noBackoff,
		RequestLogHook: func(_ retryablehttp.Logger, req *http.Request, _ int) {
			roundOf(req.Context()).beforeAttempt(req)
		},
		PrepareRetry: func(req *http.Request) error { return roundOf(req.Context()).prepareRetry(req) },
		ErrorHandler: retryablehttp.PassthroughErrorHandler,
	}
}

// roundOf returns the round whose attempt's context ctx is: the round's
// opCtx, which request made the request's context.
func roundOf(ctx context.Context) *round { return ctx.(*opCtx).rd }

// beforeAttempt is retryablehttp's RequestLogHook: an attempt starts, with
// req, which it gives a reader of the journaled body of the attempt's own
// (the transport may still be closing the last attempt's).
func (rd *round) beforeAttempt(req *http.Request) {
	a := &rd.firstAttempt
	if rd.usedFirstAttempt {
		a = &attempt{}
	}
	rd.usedFirstAttempt = true
	if req.GetBody != nil {
		// A bytes.Reader in io.NopCloser, which net/http knows to be in
		// memory: it writes the headers and the body in one write.
		a.sent.Reset(rd.d.rec.Body)
		req.Body = io.NopCloser(&a.sent)
	}
	if rd.d.obs != nil {
		a.start = rd.d.c.now()
	}
	rd.cur.Store(a)
}

// checkRetry is retryablehttp's CheckRetry: the attempt ended. It reads
// the answer, classifies it, and plans what follows: another attempt only
// for a Retry or RetrySameKey verdict, within MaxAttempts, the call's
// budget, the context's deadline (no wait runs past it), MaxRetryAfter and
// the client's shared retry budget.
func (rd *round) checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	d := rd.d
	a := rd.cur.Load()
	rd.last = a
	a.notCalled = errors.As(err, new(transportNotCalled))
	err = redactError(err) // it becomes the reason: no query's token
	if ae := unwritten(resp, a, err); ae != nil {
		// Authorize runs before the transport: nothing was written, so
		// this is no attempt, and another now would fail the same way.
		a.err = err
		a.decision = Decision{Verdict: Retry, Reason: ae.Error()}
		rd.unauthorized = ae
		return false, nil
	}
	d.sends++
	d.firstWrite()
	a.finish(resp, err, d.c.cfg.MaxResponseBytes)
	d.countResends(a)
	a.earlierMaybeApplied = d.maybeApplied
	if a.resp != nil && a.err != nil && d.answersTheKey(a) {
		d.partial = &Response{StatusCode: a.resp.StatusCode, Body: a.body}
	}
	// An answer, even a broken one, means the server received the request,
	// whatever the trace saw (it may report the write after the answer).
	// Nothing written is known only of an attempt the trace followed: a
	// failed attempt it did not may have been written (never "not sent"
	// on the word of a silent trace).
	written := a.written.Load() || a.resp != nil || !d.c.traces && !a.traced.Load() && !a.notCalled
	a.decision = d.c.classify(Attempt{Response: a.resp, Body: a.body, Err: a.err, Written: written})
	v := a.decision.Verdict
	if written && v != Retry {
		d.maybeApplied = true
	}
	if written && v != Succeeded && v != Rejected && v != KeyConflict {
		d.unknown = true
	}
	if d.c.debugging() {
		d.c.log.Debug("idem: attempt", "key", d.rec.Key, "scope", d.rec.Scope, "id", d.rec.ID,
			"attempt", d.rec.Attempts, "written", written, "verdict", v.String(), "reason", a.decision.Reason)
	}
	if !v.retryable() || ctx.Err() != nil {
		d.reportAttempt(ctx, a, written, 0)
		return false, nil
	}

	now := d.c.now()
	wait := d.c.retry.backoff(d.sends)
	if after := a.decision.RetryAfter; after > 0 {
		wait = after
		d.serverAsked(after)
	}
	start := now.Add(wait)
	switch dl, hasDeadline := ctx.Deadline(); {
	case d.sends >= d.c.retry.MaxAttempts:
		rd.stop = fmt.Errorf("gave up after %d attempts (RetryPolicy.MaxAttempts)", d.sends)
	case a.decision.RetryAfter > d.c.retry.MaxRetryAfter:
		rd.stop = fmt.Errorf("the server asked to wait %s (Retry-After), longer than RetryPolicy.MaxRetryAfter (%s): due again then",
			wait.Round(time.Second), d.c.retry.MaxRetryAfter)
	case hasDeadline && start.After(dl):
		rd.stop = fmt.Errorf("%w: the next attempt would start after the context's deadline", context.DeadlineExceeded)
		rd.due = start
	case start.After(d.deadline):
		rd.stop = fmt.Errorf("the next attempt would start after this call's budget of %s (RetryPolicy.Budget)", d.c.retry.Budget)
		rd.due = start
	case !d.c.budget.withdraw():
		rd.stop = ErrRetryBudgetExhausted
	default:
		rd.wait = wait
		d.reportAttempt(ctx, a, written, wait)
		return true, nil
	}
	d.reportAttempt(ctx, a, written, 0)
	return false, nil
}

// unwritten returns Authorize's failure when it stopped attempt a before
// anything was written. A function of its own: errors.As's target escapes,
// an allocation every attempt would pay in checkRetry.
func unwritten(resp *http.Response, a *attempt, err error) *authorizeError {
	if resp != nil || err == nil || a.written.Load() {
		return nil
	}
	var ae *authorizeError
	if errors.As(err, &ae) {
		return ae
	}
	return nil
}

// firstWrite reports whether this call has yet to write the operation,
// and if so marks it written and deposits in the shared retry budget as a
// first attempt does: a call's first write is no re-send, whether it is an
// attempt, a replay or a send after a not_found (Resume's, after a crash,
// makes no other), and it spends nothing.
func (d *driver) firstWrite() bool {
	if d.wrote {
		return false
	}
	d.wrote = true
	d.c.budget.deposit()
	return true
}

// spend takes a token from the shared retry budget for a write of the
// operation unless it is this call's first, and reports whether the write
// may be made.
func (d *driver) spend() bool {
	return d.firstWrite() || d.c.budget.withdraw()
}

func (v Verdict) retryable() bool { return v == Retry || v == RetrySameKey }

// answersTheKey reports whether an answer whose body broke off would,
// whole, have been the key's answer: a definitive one. Only such an answer
// is the server's first word on the key, which a later one must agree
// with; a cut "in progress" or "retry later" is not.
func (d *driver) answersTheKey(a *attempt) bool {
	v := d.c.classify(Attempt{Response: a.resp, Body: a.body, Written: true}).Verdict
	return v == Succeeded || v == Rejected || v == KeyConflict
}

// wrote is the trace's WroteHeaders.
func (a *attempt) wrote() {
	a.written.Store(true)
	a.writes.Add(1)
}

// finish reads the answer's body, up to limit bytes, and closes it; the
// body is kept for the journal (and Attempt.Body), and the response left
// with an empty one for the loop to drain.
func (a *attempt) finish(resp *http.Response, err error, limit int64) {
	a.resp, a.err = resp, err
	if resp == nil {
		return
	}
	body, cut, rerr := readBody(resp.Body, limit, resp.ContentLength)
	resp.Body.Close()
	resp.Body = http.NoBody
	a.body, a.cut = body, cut
	if rerr != nil {
		a.err = rerr
	}
}

// countResends adds the transport's own re-sends of a to the record: the
// next journal write stores them. Each may have reached the server: the
// connection died after a write and before any reply, so the server may
// have applied that write, whatever the last one got (a 429 answers the
// re-send, not the write that was lost).
func (d *driver) countResends(a *attempt) {
	extra := int(a.writes.Load()) - 1
	if extra <= 0 {
		return
	}
	d.rec.TransportResends += extra
	d.maybeApplied = true
	d.c.log.Debug("idem: the transport re-sent the request", "key", d.rec.Key, "times", extra)
}

// noBackoff is retryablehttp's Backoff: no wait there. checkRetry has
// chosen the wait, which prepareRetry spends: Backoff is given no request
// when there is no response, so it could not tell whose round it is.
func noBackoff(_, _ time.Duration, _ int, _ *http.Response) time.Duration { return 0 }

// prepareRetry is retryablehttp's PrepareRetry: it waits as checkRetry
// chose (the context ending stops the loop, as it would have stopped
// retryablehttp's own wait), runs Config.Authorize for the attempt about
// to start, then journals it, and why. A failing Authorize stops the loop
// with nothing journaled: no attempt. The record is already in_flight, so
// the journal write is buffered; a lost lease stops the loop before
// anything is sent.
func (rd *round) prepareRetry(req *http.Request) error {
	d := rd.d
	if err := sleep(req.Context(), rd.wait); err != nil {
		return err
	}
	if err := d.preauthorize(req); err != nil {
		rd.unauthorized = err
		return err
	}
	next := d.rec
	next.Attempts++
	next.LastError = rd.last.decision.Reason
	waited := "backoff"
	if rd.last.decision.RetryAfter > 0 {
		waited = "the server's Retry-After"
	}
	detail := fmt.Sprintf("retry, same key: %s; waited %s (%s)", rd.last.decision.Reason, rd.wait.Round(time.Millisecond), waited)
	if err := d.write(outcomeCtx(req.Context()), next, Buffered, EventSend, detail); err != nil {
		rd.journalErr = err
		return err
	}
	return nil
}

// operationKey carries the operation an HTTP request is for, for
// Config.Authorize (OperationFrom), and marks a status checker's replay.
type operationKey struct{}

// OperationInfo says which operation an HTTP request is for: Authorize
// reads it with OperationFrom to choose credentials per operation (per
// tenant, say).
type OperationInfo struct {
	Key, Scope, ID string
	// StatusCheck is true for a status checker's request, false for an
	// attempt (a replay made to check the status is an attempt).
	StatusCheck bool
}

// OperationFrom returns the operation a request is for, when the request
// is one the client sends: an attempt or a status check. Config.Authorize
// calls it on the request it is given.
func OperationFrom(ctx context.Context) (OperationInfo, bool) {
	info, ok := ctx.Value(operationKey{}).(OperationInfo)
	return info, ok
}

// withOperation makes oc the context of a request of the operation, on
// parent: it says which for Authorize, and carries the slot for the request
// Authorize prepared before the attempt was journaled (see preauthorize).
// It returns oc.
func (d *driver) withOperation(oc *opCtx, parent context.Context, statusCheck bool) context.Context {
	*oc = opCtx{Context: parent, info: OperationInfo{Key: d.rec.Key, Scope: d.rec.Scope, ID: d.rec.ID, StatusCheck: statusCheck}}
	if d.c.cfg.Authorize != nil {
		// Without Authorize, nothing is prepared: no slot, no cost.
		oc.slot = &preauth{}
	}
	return oc
}

// opCtx carries a request's operation (OperationFrom) and, with Authorize,
// its preauth slot: both values in one context, which a round keeps in
// itself, rather than a context.WithValue each and the operation boxed.
// Everything else is the parent's: a context derived from it (the
// transport's, AttemptTimeout's) is canceled with the parent's, as the
// context package does for its own (it finds the parent's cancelCtx
// through Value).
type opCtx struct {
	context.Context
	info OperationInfo
	slot *preauth
	rd   *round // the round whose attempts these are, or nil (a status check)
}

func (c *opCtx) Value(key any) any {
	switch key.(type) {
	case operationKey:
		return c.info
	case preauthKey:
		if c.slot != nil {
			return c.slot
		}
	}
	return c.Context.Value(key)
}

// preauth holds what Config.Authorize made of an attempt's request, run
// before the attempt was journaled, for the transport to send instead of
// running Authorize again. It is taken once: a redirect the attempt
// follows, which goes elsewhere, runs Authorize afresh.
type preauth struct{ req atomic.Pointer[http.Request] }

type preauthKey struct{}

// preauthorize runs Config.Authorize on a copy of req, an attempt about to
// be journaled and sent, and keeps the result for the transport. Run
// before the journal write, a failing Authorize is no attempt: nothing is
// journaled, nothing sent.
//
// The copy has the journaled body of its own, which an Authorize that
// signs the body may read (the request's own is not ready until it is
// sent, and reading it would leave nothing to send), and the attempt's
// bound, AttemptTimeout, which held Authorize when the transport ran it:
// a token fetch that hangs must not hold the operation, and its lease,
// for ever.
func (d *driver) preauthorize(req *http.Request) *authorizeError {
	c := d.c
	if c.cfg.Authorize == nil {
		return nil // no slot to look up: the context's whole chain
	}
	slot, _ := req.Context().Value(preauthKey{}).(*preauth)
	if slot == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(untraced{req.Context()}, c.cfg.AttemptTimeout)
	defer cancel()
	r := req.Clone(ctx)
	body := d.rec.Body
	r.ContentLength = int64(len(body))
	r.Body, r.GetBody = http.NoBody, func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	if len(body) > 0 {
		r.Body, _ = r.GetBody()
	}
	given := r.Body
	if err := c.cfg.Authorize(r); err != nil {
		return &authorizeError{err}
	}
	if k := d.form.header; !sameKey(r.Header, req.Header, k) {
		return &authorizeError{fmt.Errorf("it set %s, the header of the operation's idempotency key: the journaled key is the one sent on every attempt; leave that header to the client", k)}
	}
	if r.Body != given && !sameBody(r.Body, body) {
		return &authorizeError{errors.New("it changed the request's body, but what is sent is the journaled body with Authorize's headers, URL and Host: Authorize may read the body (to sign it) and put the same bytes back; change the body in the request itself")}
	}
	slot.req.Store(r)
	return nil
}

// untraced is a request's context without the attempt's ClientTrace, for
// Authorize: a token it fetches over HTTP with that context is its own
// request, not the attempt written again (TransportResends).
type untraced struct{ context.Context }

func (c untraced) Value(key any) any {
	v := c.Context.Value(key)
	if _, ok := v.(*httptrace.ClientTrace); ok {
		return nil
	}
	return v
}

// sameKey reports whether got carries the key's header, name, as want
// does, under no other spelling: Authorize left the key alone.
func sameKey(got, want http.Header, name string) bool {
	canon := http.CanonicalHeaderKey(name)
	for n := range got {
		if n != name && n != canon && http.CanonicalHeaderKey(n) == canon {
			return false
		}
	}
	return slices.Equal(got[name], want[name]) && slices.Equal(got[canon], want[canon])
}

// sameBody reports whether an Authorize that replaced the body (it read
// it and put it back, say) left the journaled bytes there.
func sameBody(rc io.ReadCloser, body []byte) bool {
	if rc == nil {
		return len(body) == 0
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, int64(len(body))+1))
	return err == nil && bytes.Equal(b, body)
}

// preauthorized takes the request Authorize prepared for req's attempt, if
// there is one.
func preauthorized(req *http.Request) *http.Request {
	if slot, _ := req.Context().Value(preauthKey{}).(*preauth); slot != nil {
		return slot.req.Swap(nil)
	}
	return nil
}

// errJournal wraps a journal error met while a status checker sent a
// replay, so that the driver tells it from the checker's own failures.
type errJournal struct{ err error }

func (e errJournal) Error() string { return "journal: " + e.err.Error() }
func (e errJournal) Unwrap() error { return e.err }
