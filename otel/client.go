package otel

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
)

// Span names. A call's span is named "idem.<call> <method>": idem.do POST,
// idem.send POST, idem.resume POST.
const (
	spanAttempt     = "idem.attempt"
	spanStatusCheck = "idem.status_check"
)

// clientKind is made once: an option made per span is an allocation.
var clientKind = trace.WithSpanKind(trace.SpanKindClient)

// callSpanNames are the names of calls' spans, made once.
var callSpanNames = func() map[idem.CallKind]map[string]string {
	names := map[idem.CallKind]map[string]string{}
	for _, k := range []idem.CallKind{idem.CallDo, idem.CallSend, idem.CallResume} {
		names[k] = map[string]string{}
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
			http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace, "_OTHER"} {
			names[k][m] = "idem." + k.String() + " " + m
		}
	}
	return names
}()

func callSpanName(k idem.CallKind, m string) string {
	if n, ok := callSpanNames[k][m]; ok {
		return n
	}
	return "idem." + k.String() + " " + m
}

// ClientHooks returns hooks for idem.Config.Hooks that trace each call and
// record the client's metrics (see the package documentation for what each
// span and instrument holds).
func ClientHooks(opts ...Option) idem.Hooks {
	cfg := newConfig(opts)
	c := &client{
		tracer:      cfg.tracerProvider.Tracer(instrumentationName),
		propagator:  cfg.propagator,
		operationID: cfg.operationID,
		metrics:     newClientMetrics(cfg.meterProvider.Meter(instrumentationName)),
	}
	return idem.Hooks{
		CallStart:   c.callStart,
		CallEnd:     c.callEnd,
		Attempt:     c.attempt,
		StatusCheck: c.statusCheck,
		Propagate:   c.propagate,
		Link:        Traceparent,
	}
}

type client struct {
	tracer      trace.Tracer
	propagator  propagation.TextMapPropagator
	operationID bool
	metrics     clientMetrics
}

// callState is one call's, in the context CallStart returns.
type callState struct {
	span  trace.Span
	start time.Time
	// http holds the attributes every HTTP span of the call shares: the
	// method, server.address and server.port.
	http []attribute.KeyValue
	// linked: the span has a link to the call that created the operation;
	// hashed: it has the key's hash (a Do learns its key only as it runs).
	linked, hashed bool

	mu sync.Mutex
	// pending is the span of the request on the wire: Propagate starts it,
	// so that the traceparent a request carries names the attempt's (or
	// status check's) span and the server's span nests under it; the
	// Attempt or StatusCheck hook that reports the request ends it.
	pending trace.Span
}

type callStateKey struct{}

func callStateFrom(ctx context.Context) *callState {
	st, _ := ctx.Value(callStateKey{}).(*callState)
	return st
}

func (c *client) callStart(ctx context.Context, call idem.Call) context.Context {
	m := method(call.Method)
	st := &callState{start: time.Now()}
	st.http = append(make([]attribute.KeyValue, 0, 3), keyMethod.String(m))
	if host, port, ok := hostPort(call.URL); ok {
		st.http = append(st.http, keyAddress.String(host))
		if port > 0 {
			st.http = append(st.http, keyPort.Int(port))
		}
	}
	attrs := append(make([]attribute.KeyValue, 0, len(st.http)+5), st.http...)
	attrs = append(attrs, keyCall.String(call.Kind.String()), keyScope.String(call.Scope))
	if call.Key != "" {
		attrs = append(attrs, keyKeyHash.String(KeyHash(call.Scope, call.Key)))
		st.hashed = true
	}
	if c.operationID {
		attrs = append(attrs, keyOperationID.String(call.ID))
	}
	if call.TakenFrom != "" {
		attrs = append(attrs, keyTakenFrom.String(call.TakenFrom))
		c.metrics.takeover(ctx, call)
	}
	opts := []trace.SpanStartOption{clientKind, trace.WithAttributes(attrs...)}
	// A call that starts from the journal (Send, Resume) links to the
	// call that created the operation, in another trace, maybe another
	// process that died.
	if sc := parseTraceparent(call.Link); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		st.linked = true
	}
	ctx, st.span = c.tracer.Start(ctx, callSpanName(call.Kind, m), opts...)
	return context.WithValue(ctx, callStateKey{}, st)
}

func (c *client) callEnd(ctx context.Context, call idem.Call, end idem.CallEnd) {
	st := callStateFrom(ctx)
	if st == nil {
		return
	}
	st.mu.Lock()
	if st.pending != nil {
		// A request no hook reported: end its span rather than leak it.
		st.pending.End()
		st.pending = nil
	}
	st.mu.Unlock()
	key := end.Key
	if key == "" {
		key = call.Key
	}
	var state, errType string
	if end.State != 0 {
		state = end.State.String()
	}
	if end.Err != nil {
		errType = callErrorType(end.Err)
	}
	if span := st.span; span.IsRecording() {
		attrs := make([]attribute.KeyValue, 0, 8)
		attrs = append(attrs, keyAttempts.Int(end.Attempts), keyStatusChecks.Int(end.StatusChecks), keyReplayed.Bool(end.Replayed))
		if key != "" && !st.hashed {
			attrs = append(attrs, keyKeyHash.String(KeyHash(call.Scope, key)))
		}
		if state != "" {
			attrs = append(attrs, keyState.String(state))
		}
		if end.Settled != idem.SettledDirectly {
			attrs = append(attrs, keySettledBy.String(end.Settled.String()))
		}
		if end.Expired {
			attrs = append(attrs, keyExpired.Bool(true))
		}
		if errType != "" {
			attrs = append(attrs, keyErrorType.String(errType))
			span.SetStatus(codes.Error, errType)
		}
		span.SetAttributes(attrs...)
		// A Do that found its operation journaled learns the link only
		// now; a Do that created it has its own span's as the link.
		if !st.linked {
			if sc := parseTraceparent(call.Link); sc.IsValid() && sc.SpanID() != span.SpanContext().SpanID() {
				span.AddLink(trace.Link{SpanContext: sc})
			}
		}
		span.End()
	}
	c.metrics.callEnd(ctx, call, end, state, errType, time.Since(st.start))
}

// requestSpan returns the span of the request a hook reports: the one
// Propagate started for it, or, when none was (no request reached the
// transport), one that starts when the request did.
func (c *client) requestSpan(ctx context.Context, name string, start time.Time) (trace.Span, *callState) {
	st := callStateFrom(ctx)
	if st != nil {
		st.mu.Lock()
		span := st.pending
		st.pending = nil
		st.mu.Unlock()
		if span != nil {
			span.SetName(name)
			return span, st
		}
	}
	_, span := c.tracer.Start(ctx, name, clientKind, trace.WithTimestamp(start))
	return span, st
}

func (c *client) attempt(ctx context.Context, a idem.AttemptInfo) {
	span, st := c.requestSpan(ctx, spanAttempt, a.Start)
	if span.IsRecording() {
		attrs := make([]attribute.KeyValue, 0, 10)
		if st != nil {
			attrs = append(attrs, st.http...)
		}
		attrs = append(attrs, keyAttempt.Int(a.Number), keyVerdict.String(verdict(a.Decision.Verdict)),
			keyWritten.Bool(a.Written), keyReplayed.Bool(a.Replayed))
		if a.StatusCode > 0 {
			attrs = append(attrs, keyStatusCode.Int(a.StatusCode))
		}
		if a.Wait > 0 {
			attrs = append(attrs, keyWaitMS.Int64(a.Wait.Milliseconds()))
		}
		var errType string
		switch {
		case a.Err != nil:
			errType = transportErrorType(a.Err)
		case a.StatusCode >= 400:
			errType = strconv.Itoa(a.StatusCode)
		}
		if errType != "" {
			attrs = append(attrs, keyErrorType.String(errType))
		}
		span.SetAttributes(attrs...)
		if a.Decision.Verdict != idem.Succeeded {
			desc := errType
			if desc == "" {
				desc = verdict(a.Decision.Verdict)
			}
			span.SetStatus(codes.Error, desc)
		}
	}
	span.End(trace.WithTimestamp(a.End))
}

func (c *client) statusCheck(ctx context.Context, s idem.StatusCheckInfo) {
	span, _ := c.requestSpan(ctx, spanStatusCheck, s.Start)
	if span.IsRecording() {
		attrs := make([]attribute.KeyValue, 0, 6)
		attrs = append(attrs, keyStatusCheck.Int(s.Number), keyStatusReplay.Bool(s.Replay))
		if s.Err == nil {
			attrs = append(attrs, keyStatusState.String(s.State.String()))
		}
		if s.StatusCode > 0 {
			attrs = append(attrs, keyStoredStatus.Int(s.StatusCode))
		}
		if s.RetryAfter > 0 {
			attrs = append(attrs, keyRetryAfterMS.Int64(s.RetryAfter.Milliseconds()))
		}
		if s.Err != nil {
			errType := transportErrorType(s.Err)
			attrs = append(attrs, keyErrorType.String(errType))
			span.SetStatus(codes.Error, errType)
		}
		span.SetAttributes(attrs...)
	}
	span.End(trace.WithTimestamp(s.End))
}

// propagate writes the trace context of the request's own span on it.
// Within a call the client sends one request at a time (an attempt, or a
// status check), and each is reported by a hook before the next is sent;
// a redirect sends the same request again, with the same span.
func (c *client) propagate(ctx context.Context, h http.Header) {
	st := callStateFrom(ctx)
	if st == nil {
		c.propagator.Inject(ctx, propagation.HeaderCarrier(h))
		return
	}
	st.mu.Lock()
	if st.pending == nil {
		name := spanAttempt
		if info, ok := idem.OperationFrom(ctx); ok && info.StatusCheck {
			name = spanStatusCheck
		}
		_, st.pending = c.tracer.Start(ctx, name, clientKind)
	}
	span := st.pending
	st.mu.Unlock()
	c.propagator.Inject(trace.ContextWithSpan(ctx, span), propagation.HeaderCarrier(h))
}

// Traceparent returns the W3C traceparent of the span in ctx, or "" when
// it has none: what ClientHooks journals with each new operation
// (Hooks.Link), so that a later call (Resume after a crash) links its span
// to the trace that created the operation. Only the traceparent: no
// tracestate nor baggage, which could carry what the journal must not hold.
func Traceparent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// parseTraceparent reads a journaled link; anything but a valid W3C
// traceparent gives an invalid SpanContext.
func parseTraceparent(s string) trace.SpanContext {
	if s == "" {
		return trace.SpanContext{}
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": s})
	return trace.SpanContextFromContext(ctx)
}
