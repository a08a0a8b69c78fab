package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/journal"
)

// checkStatus asks the server what became of the operation until it
// answers definitively, says it never saw the key, or this call must stop.
// Every check is journaled with its answer, or with why it failed.
func (d *driver) checkStatus(ctx context.Context) error {
	for {
		if err := ctx.Err(); err != nil {
			return d.stop(ctx, fmt.Errorf("%w; before that: %w", err, d.cause), d.failedDue())
		}
		if d.checks >= d.c.retry.MaxStatusChecks && !d.waitsForDeadline(ctx) {
			return d.stop(ctx, fmt.Errorf("no definitive status after %d checks (RetryPolicy.MaxStatusChecks): %w", d.checks, d.cause), d.failedDue())
		}
		var backoff time.Duration
		if d.checks > 0 {
			backoff = d.c.retry.backoff(d.checks)
		}
		if err := d.waitForServer(ctx, backoff); err != nil {
			return err
		}
		if d.pastRetention() {
			return d.expire(ctx)
		}
		d.checks++
		d.replayed = false
		var start time.Time
		if d.obs != nil {
			start = d.c.now()
		}
		st, err := d.c.status.CheckStatus(ctx, d.query(ctx))
		d.reportCheck(ctx, start, st, err)
		if err != nil {
			var je errJournal
			if errors.As(err, &je) {
				return d.journalFailed(je.err)
			}
			// The next check waits for the server's time, as the next
			// attempt would: within this call up to MaxRetryAfter, else
			// the operation is due again then.
			d.serverAsked(st.RetryAfter)
			before := d.cause
			d.cause = fmt.Errorf("status check by %s: %w", d.c.statusName, err)
			if errors.Is(err, ErrAuthorizeFailed) || errors.Is(err, ErrRetryBudgetExhausted) {
				// Every further check would fail the same way (the
				// budget refills in time, not within this call's
				// backoff: an attempt's round stops on it too).
				return d.stop(ctx, d.cause, d.failedDue())
			}
			if ctx.Err() != nil {
				why := fmt.Errorf("%w; %w", ctx.Err(), d.cause)
				if before == errProcessing {
					// The check the context cut off says nothing: the
					// last answer is what the caller waited for.
					why = fmt.Errorf("%w; before that: %w", why, before)
				}
				return d.stop(ctx, why, d.failedDue())
			}
			if err := d.recordCheck(ctx, "failed: "+err.Error()); err != nil {
				return err
			}
			continue
		}
		switch st.State {
		case StatusCompleted:
			if st.Response == nil {
				d.cause = fmt.Errorf("status check by %s: %w: completed without a response", d.c.statusName, ErrBadStatus)
				break
			}
			return d.settleFromStatus(ctx, st)
		case StatusNotFound:
			if d.answered() {
				return d.keyForgotten(ctx)
			}
			// The server has not seen the key yet: send it again, same
			// key. An earlier attempt may still be on its way (held in a
			// gateway, delayed in the network) and arrive after this
			// answer, so the operation stays maybe applied: should the
			// re-send be refused, it is unknown, not pending.
			d.next = stepSend
			d.why = fmt.Sprintf("send again, same key: status check %d said the server never saw the key", d.checks)
			d.resend = true
			return nil
		case StatusProcessing:
			d.cause = errProcessing
			d.serverAsked(st.RetryAfter)
			detail := "processing"
			if st.RetryAfter > 0 {
				detail += fmt.Sprintf(" (Retry-After %s)", st.RetryAfter)
			}
			if err := d.recordCheck(ctx, detail); err != nil {
				return err
			}
			continue
		default:
			d.cause = fmt.Errorf("status check by %s: %w: it answered %v", d.c.statusName, ErrBadStatus, st.State)
		}
		if err := d.recordCheck(ctx, d.cause.Error()); err != nil {
			return err
		}
	}
}

// answered reports whether this call holds proof that the server received
// the key and applied the request: a success status line whose body broke
// off (partial). A status check that then says not_found does not make
// the request unseen; a cut refusal does not count, as a server need not
// keep a request it refused.
func (d *driver) answered() bool {
	if d.proof == 0 && d.partial != nil {
		resp := &http.Response{StatusCode: d.partial.StatusCode, Header: http.Header{}}
		if d.c.classify(Attempt{Response: resp, Body: d.partial.Body, Written: true}).Verdict == Succeeded {
			d.proof = d.partial.StatusCode
		}
	}
	return d.proof != 0
}

// The proof that the server applied the key (a success status line whose
// body broke off) is journaled with the operation, at the start of the
// LastError of every active record written after it: "the server answered
// the key HTTP 201 (body cut): <why it is not settled>". A later call (Do,
// Send, Resume, in this process or another, after the call that saw the
// answer ended unsettled) reads it back, so that its status check's
// not_found parks the operation instead of sending the request again.
const (
	proofNote = "the server answered the key HTTP "
	proofEnd  = " (body cut): "
)

// withProof returns lastError noted with the proof of a success answered
// with status code.
func withProof(code int, lastError string) string {
	return proofNote + strconv.Itoa(code) + proofEnd + lastError
}

// proofIn returns the status code of the proof lastError notes, or zero,
// and the rest of lastError.
func proofIn(lastError string) (int, string) {
	rest, ok := strings.CutPrefix(lastError, proofNote)
	if !ok {
		return 0, lastError
	}
	digits, rest, ok := strings.Cut(rest, proofEnd)
	code, err := strconv.Atoi(digits)
	if !ok || err != nil || code < 100 || code > 999 {
		return 0, lastError
	}
	return code, rest
}

// keyForgotten handles a status endpoint that says it never saw a key
// whose request the server answered with a success: the server lost the
// key (or the endpoint is not the one that keeps it), so a re-send would
// be executed as a new request. Nothing more is sent: the operation is
// parked as expired, for an operator to check the business records and
// Reconcile.
func (d *driver) keyForgotten(ctx context.Context) error {
	cause := fmt.Errorf("%w: key %s was answered HTTP %d, then status check %d by %s said the server never saw it; a re-send would be executed again, so it is not re-sent: check the business records, then Reconcile",
		ErrKeyNotHonoured, d.rec.Key, d.proof, d.checks, d.c.statusName)
	// Durable: losing this would let a resume send the request again.
	return d.park(ctx, cause, Durable)
}

// recordCheck journals a status check that did not settle the operation:
// its answer, or why it failed. The first time a check fails for a cause
// (the record's LastError said otherwise), it is logged at warn level: a
// status endpoint that fails is something an operator must see.
func (d *driver) recordCheck(ctx context.Context, detail string) error {
	cause := d.cause.Error()
	if _, last := proofIn(d.rec.LastError); last != cause && d.cause != errProcessing {
		d.c.log.Warn("idem: status check did not settle the operation", "key", d.rec.Key, "scope", d.rec.Scope,
			"id", d.rec.ID, "check", d.checks, "error", cause)
	}
	next := d.rec
	next.State = StateUnknown
	next.LastError = cause
	if err := d.write(outcomeCtx(ctx), next, Buffered, EventStatus, fmt.Sprintf("check %d: %s", d.checks, detail)); err != nil {
		return d.journalFailed(err)
	}
	return nil
}

// errProcessing is the cause while the server is still at work: no failure,
// so recordCheck does not warn about it.
var errProcessing = errors.New("the server is still processing the key")

// settleFromStatus records the server's stored answer for the key. Every
// stored answer is final for the key, whatever its status.
func (d *driver) settleFromStatus(ctx context.Context, st Status) error {
	resp := st.Response
	// The checker's header map is its own, its names as the server or a
	// decoder spelled them: the stored answer gets a copy in canonical
	// form, without secrets, before anything (the Classifier included)
	// reads it.
	resp.Header = resp.Header.Clone()
	d.c.dropSecrets(resp.Header)
	v := d.c.classify(Attempt{Response: &http.Response{StatusCode: resp.StatusCode, Header: resp.Header}, Body: resp.Body, Written: true})
	if v.Verdict == KeyConflict && d.replayed {
		return d.replayConflict(ctx, v)
	}
	if d.partial != nil && !agrees(d.partial, resp) {
		return d.keyNotHonoured(ctx, resp)
	}
	switch v.Verdict {
	case Succeeded, KeyConflict:
	default:
		v.Verdict = Rejected
	}
	if !d.replayed {
		// A status endpoint answers from the server's store of keys; a
		// replay says so with its headers, or executed the request.
		resp.Replayed = true
	}
	detail := fmt.Sprintf("check %d: completed, HTTP %d", d.checks, resp.StatusCode)
	return d.settle(ctx, v, resp, st.BodyCut, EventStatus, detail)
}

// replayConflict handles a key conflict answering a replay (ReplayStatus):
// the replay is the journaled request, the only one the client sends under
// the key, so the request the server holds the key for is an earlier
// attempt of this operation, in a form the server tells apart (an
// Authorize that puts a fresh token in the URL, a signed header). That
// attempt may have been applied: no rejection. The outcome stays unknown,
// and the call stops, as every replay would meet the same answer; an
// operator who finds the outcome settles it with Reconcile, or it expires
// with the server's retention.
func (d *driver) replayConflict(ctx context.Context, v Decision) error {
	d.cause = fmt.Errorf("status check by %s: %s, answering the replay of the journaled request: the key is held for an earlier attempt of this operation, in a form the server tells apart (does Authorize change the URL or a signed header?), which may have been applied; a replay cannot learn its outcome",
		d.c.statusName, v.Reason)
	return d.stop(ctx, d.cause, d.failedDue())
}

// query is what the status checker gets: the record, and the means to
// send requests through the client as attempts are sent.
func (d *driver) query(ctx context.Context) StatusQuery {
	return StatusQuery{
		Record: journal.CloneRecord(d.rec),
		Do:     d.statusDo,
		Request: func(ctx context.Context) (*http.Request, error) {
			req, err := http.NewRequestWithContext(context.WithValue(ctx, replayKey{}, true), d.rec.Method, d.rec.URL, bytes.NewReader(d.rec.Body))
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

// replayKey marks a request built by StatusQuery.Request: the journaled
// request, whose sending is an attempt.
type replayKey struct{}

// statusDo sends a status checker's request. The key goes in the record's
// form; a replay of the journaled request is an attempt like any other:
// journaled first (fenced by the lease: a driver that lost its lease sends
// nothing more), counted, and its transport re-sends counted too.
func (d *driver) statusDo(req *http.Request) (*http.Response, error) {
	replay := req.Context().Value(replayKey{}) != nil
	a := &attempt{}
	trace := &httptrace.ClientTrace{WroteHeaders: a.wrote}
	ctx := d.withOperation(&opCtx{}, httptrace.WithClientTrace(req.Context(), trace), !replay)
	req = req.WithContext(ctx)
	d.form.set(req.Header, d.rec.Key)
	if replay {
		// Authorize first: a replay it stops is no attempt.
		if err := d.preauthorize(req); err != nil {
			return nil, err
		}
		// A replay is a re-send of the request, as heavy for the server
		// as a retry: it spends the shared retry budget as one does,
		// unless it is this call's first write (Resume's, after a crash).
		if !d.spend() {
			return nil, fmt.Errorf("%w: the replay, a re-send of the request, was not made", ErrRetryBudgetExhausted)
		}
		d.replayed = true
		next := d.rec
		next.Attempts++
		if err := d.write(outcomeCtx(req.Context()), next, Buffered, EventSend,
			fmt.Sprintf("check %d: replay, same key and request, to learn the outcome", d.checks)); err != nil {
			return nil, errJournal{err}
		}
	}
	resp, err := d.c.attempts.Do(req)
	if replay {
		d.countResends(a)
	}
	// The checker's error becomes the check's reason: no query's token.
	return resp, redactError(err)
}

// statusCheckerName names a checker in errors and logs: by its Name or
// String method if it has one, else by its type.
func statusCheckerName(s StatusChecker) string {
	switch n := s.(type) {
	case interface{ Name() string }:
		return n.Name()
	case fmt.Stringer:
		return n.String()
	}
	return fmt.Sprintf("%T", s)
}
