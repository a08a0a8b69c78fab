package idem

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/journal"
)

// Hooks observe the client's work, for tracing and metrics: the module
// github.com/idemkit/idem/otel implements them with OpenTelemetry. Every
// field may be nil, and a client without hooks pays a nil check for each.
//
// A hook runs on the goroutine doing the work and delays it: keep it fast.
// Hooks may be called concurrently (Resume drives several operations at
// once). What they are given holds no body, no header value and no
// credential.
type Hooks struct {
	// CallStart is called when a call starts to drive an operation: Do
	// and Send (before the first journal write, so that it covers the
	// intent) and Resume (once per operation it drives). The context it
	// returns is the one the call runs with: its journal writes, attempts
	// and status checks, and the hooks below, receive it.
	CallStart func(ctx context.Context, call Call) context.Context
	// CallEnd is called when that call returns, with the context CallStart
	// returned.
	CallEnd func(ctx context.Context, call Call, end CallEnd)
	// Attempt is called when an attempt has ended and been classified,
	// with the wait chosen before the next one.
	Attempt func(ctx context.Context, a AttemptInfo)
	// StatusCheck is called when a status check has ended.
	StatusCheck func(ctx context.Context, s StatusCheckInfo)
	// Propagate adds headers to each request the client sends, attempts
	// and status checks, right before it is sent: the trace context
	// (traceparent), say. What it adds is neither part of the fingerprint
	// nor journaled. It is given a header of its own, and only the names
	// the request does not carry yet (under any spelling) are added from
	// it: what it writes under the key's header, or any other the request
	// carries (the journaled ones, Authorize's), is not sent, so that one
	// operation goes out under one key.
	Propagate func(ctx context.Context, h http.Header)
	// Link returns what is journaled with a new operation so that a later
	// call, Resume after a crash say, can relate its work to the call that
	// created the operation: a W3C traceparent. It is stored in clear and
	// shown by the CLI: it must hold nothing secret. Longer than
	// MaxLinkLength, it is not journaled.
	Link func(ctx context.Context) string
}

// MaxLinkLength is the longest Hooks.Link value journaled.
const MaxLinkLength = journal.MaxLinkLength

// A CallKind says which method made a call.
type CallKind uint8

const (
	CallDo CallKind = iota + 1
	CallSend
	CallResume
)

var callKindNames = [...]string{CallDo: "do", CallSend: "send", CallResume: "resume"}

func (k CallKind) String() string {
	if int(k) < len(callKindNames) && callKindNames[k] != "" {
		return callKindNames[k]
	}
	return "CallKind(?)"
}

// Call is one call driving one operation, as the hooks see it.
type Call struct {
	Kind CallKind
	// Scope and ID name the operation. Key is its key when the call starts
	// from the journal (Send, Resume); for Do it is known at CallEnd.
	Scope, ID, Key string
	// Method and URL are the request's; URL without its query and userinfo,
	// which may carry a token, as in every error and log of the client
	// (the journaled request keeps the whole URL: it is sent again). The
	// otel module takes only its host and port.
	Method, URL string
	// Link is what Hooks.Link returned when the operation was created,
	// when the call starts from the journal.
	Link string
	// TakenFrom names the owner a Resume took the operation's lease from
	// (its process was gone or its lease had lapsed), or is empty.
	TakenFrom string
}

// CallEnd is how a call ended.
type CallEnd struct {
	// Key is the operation's key, and State its journaled state when the
	// call returned; zero when nothing was journaled (bad input, a refused
	// create).
	Key   string
	State State
	// Err is what the call returned (nil exactly when it succeeded).
	Err error
	// Attempts and StatusChecks count what this call sent.
	Attempts, StatusChecks int
	// Settled says how an operation whose outcome had been unknown to this
	// call was settled by it, or is SettledDirectly.
	Settled Settlement
	// Replayed is the answer's: the server answered from its store of keys.
	Replayed bool
	// Expired reports that this call moved the operation to expired (its
	// retention passed unconfirmed, or the server did not honour its key),
	// as opposed to finding it expired already: a count of expirations
	// counts these.
	Expired bool
}

// Settlement says how an operation whose outcome was unknown got its
// definitive answer.
type Settlement uint8

const (
	// SettledDirectly: the call's outcome was never unknown, or the call
	// did not settle it.
	SettledDirectly Settlement = iota
	// SettledByStatusCheck: a status check answered with the stored result.
	SettledByStatusCheck
	// SettledByResend: the request was sent again with the same key and
	// answered.
	SettledByResend
)

var settlementNames = [...]string{"directly", "status_check", "resend"}

func (s Settlement) String() string {
	if int(s) < len(settlementNames) {
		return settlementNames[s]
	}
	return "Settlement(?)"
}

// AttemptInfo is one attempt, as the Attempt hook sees it.
type AttemptInfo struct {
	Call
	// Number is the operation's attempt number, counted over its life.
	Number int
	// Start and End bound the attempt, reading the answer's body included.
	Start, End time.Time
	// Written reports that the request (its headers at least) was written:
	// the server may have it.
	Written bool
	// StatusCode is the answer's, or zero when none came (Err says why).
	StatusCode int
	// Replayed reports that the server answered from its store of keys.
	Replayed bool
	Err      error
	// Decision is the classifier's verdict and reason.
	Decision Decision
	// Wait is the wait before the next attempt, or zero when this was the
	// call's last attempt.
	Wait time.Duration
}

// StatusCheckInfo is one status check, as the StatusCheck hook sees it.
type StatusCheckInfo struct {
	Call
	// Number counts this call's status checks.
	Number     int
	Start, End time.Time
	// State is the server's answer; StatusCode is the stored response's
	// status when State is StatusCompleted.
	State      StatusState
	StatusCode int
	RetryAfter time.Duration
	// Replay reports that the checker sent the request again (same key) to
	// learn the outcome.
	Replay bool
	// Err says why the check failed, when it did.
	Err error
}

// observation is one observed call: its Call and what CallEnd reports,
// filled in by the driver the call runs. It travels in the call's context,
// which exists only when the client has hooks.
type observation struct {
	call Call
	end  CallEnd
}

type observationKey struct{}

func observationFrom(ctx context.Context) *observation {
	o, _ := ctx.Value(observationKey{}).(*observation)
	return o
}

// observed reports whether any hook that follows calls is set.
func (h *Hooks) observed() bool {
	return h.CallStart != nil || h.CallEnd != nil || h.Attempt != nil || h.StatusCheck != nil
}

// observe runs fn as the call described by call, between the CallStart and
// CallEnd hooks, when the client has any.
func (c *Client) observe(ctx context.Context, call Call, fn func(context.Context) (*Result, error)) (*Result, error) {
	if !c.observed {
		return fn(ctx)
	}
	h := &c.cfg.Hooks
	call.URL = redactString(call.URL)
	o := &observation{call: call}
	ctx = context.WithValue(ctx, observationKey{}, o)
	if h.CallStart != nil {
		ctx = h.CallStart(ctx, call)
	}
	res, err := fn(ctx)
	if h.CallEnd != nil {
		end := o.end
		end.Err = err
		var oe *OperationError
		switch {
		case res != nil:
			end.Key, end.State, end.Replayed = res.Key, res.State, res.Replayed
		case errors.As(err, &oe):
			end.Key, end.State = oe.Key, oe.State
		}
		if end.Key == "" {
			end.Key = call.Key
		}
		h.CallEnd(ctx, o.call, end)
	}
	return res, err
}

// link returns what Hooks.Link says to journal with a new operation.
func (c *Client) link(ctx context.Context) string {
	if c.cfg.Hooks.Link == nil {
		return ""
	}
	if l := c.cfg.Hooks.Link(ctx); len(l) <= MaxLinkLength {
		return l
	}
	return ""
}

// callOf describes a call that starts from a journaled record.
func callOf(kind CallKind, rec Record) Call {
	return Call{Kind: kind, Scope: rec.Scope, ID: rec.ID, Key: rec.Key, Method: rec.Method, URL: rec.URL, Link: rec.Link}
}

// reportAttempt calls the Attempt hook for a, which ended at end.
func (d *driver) reportAttempt(ctx context.Context, a *attempt, written bool, wait time.Duration) {
	if d.obs == nil {
		return
	}
	d.obs.end.Attempts++
	hook := d.c.cfg.Hooks.Attempt
	if hook == nil {
		return
	}
	info := AttemptInfo{Call: d.obs.call, Number: d.rec.Attempts, Start: a.start, End: d.c.now(), Written: written,
		Err: a.err, Decision: a.decision, Wait: wait}
	if a.resp != nil {
		info.StatusCode, info.Replayed = a.resp.StatusCode, wire.Replayed(a.resp.Header)
	}
	hook(ctx, info)
}

// reportCheck calls the StatusCheck hook.
func (d *driver) reportCheck(ctx context.Context, start time.Time, st Status, err error) {
	if d.obs == nil {
		return
	}
	d.obs.end.StatusChecks++
	hook := d.c.cfg.Hooks.StatusCheck
	if hook == nil {
		return
	}
	info := StatusCheckInfo{Call: d.obs.call, Number: d.checks, Start: start, End: d.c.now(), State: st.State,
		RetryAfter: st.RetryAfter, Replay: d.replayed, Err: err}
	if st.Response != nil {
		info.StatusCode = st.Response.StatusCode
	}
	hook(ctx, info)
}
