// Package otel traces and measures idem's client, its journal and its
// server middleware with OpenTelemetry. It is a module of its own
// (github.com/idemkit/idem/otel), so that an application that does not
// trace never downloads OpenTelemetry; it depends on OpenTelemetry's API
// only, and uses whatever SDK and exporters the application set up.
//
// Its name is otel, like OpenTelemetry's own package: import it under
// another name when both are used in one file.
//
//	import idemotel "github.com/idemkit/idem/otel"
//
//	j, err := idem.OpenSQLite("ops.db", idem.SQLiteOnCommit(idemotel.JournalCommitHook()))
//	c, err := idem.New(idem.Config{Journal: j, BaseURL: api, Hooks: idemotel.ClientHooks()})
//	mw, err := server.New(server.Config{Store: store, Scope: tenant, OnOutcome: idemotel.ServerHooks()})
//
// Each defaults to the global providers and propagator (otel.GetTracerProvider,
// otel.GetMeterProvider, otel.GetTextMapPropagator); WithTracerProvider,
// WithMeterProvider and WithPropagator name others.
//
// # Spans
//
// Each call that drives an operation gets a span of kind Client: "idem.do
// POST", "idem.send POST", "idem.resume POST". Each request the call sends
// is a child span of kind Client: "idem.attempt" for an attempt,
// "idem.status_check" for a status check. They are spans, not events on
// the call's span, because a request has a duration, and because the trace
// context each request carries (Hooks.Propagate) names its own span: the
// server's span of that request (from otelhttp, say) nests under the
// attempt that sent it, so a trace viewer shows the server's work for a
// lost response inside the attempt that lost it, followed by the status
// check that found its result and the status endpoint's span under it.
// The wait before the next attempt is the gap between two attempt spans,
// and is on the first as idem.wait_ms.
//
//	idem.do POST           http.request.method, server.address, server.port,
//	                       idem.call, idem.operation.scope, idem.key.hash,
//	                       idem.state, idem.attempts, idem.status_checks,
//	                       idem.replayed, idem.settled_by, idem.expired,
//	                       idem.lease.taken_from, error.type; status Error
//	                       when the call returned an error
//	  idem.attempt         idem.attempt (its number over the operation's
//	                       life), idem.verdict, http.response.status_code,
//	                       idem.written, idem.replayed, idem.wait_ms,
//	                       error.type; status Error unless it succeeded
//	  idem.status_check    idem.status_check (its number in the call),
//	                       idem.status.state, idem.status.stored_status_code,
//	                       idem.status.replay, idem.status.retry_after_ms,
//	                       error.type; status Error when the check failed
//
// error.type on a call is the class of its error, tested with errors.Is,
// the more specific first as in idem's error table: idem.ErrKeyConflict,
// idem.ErrRejected, idem.ErrKeyNotHonoured, idem.ErrNeedsReconciliation,
// idem.ErrNotSent, idem.ErrOutcomeUnknown, ... (attrs.go has the list).
// On a request it is the status code of an error answer, or the class of
// a transport error (timeout, eof, connection_reset, connection_refused,
// idem.ErrBadStatus, _OTHER).
//
// Every new operation is journaled with the traceparent of the span that
// created it (Hooks.Link: the call's span for Do, the caller's span for
// Begin). A later call that starts from the journal, Resume after a crash
// above all, gets a span link to it: the resumed work of a process that
// died is one click from the trace that began it. The link is a bare
// traceparent, never tracestate nor baggage. The trace context on the wire
// is written by the propagator and is neither journaled nor part of the
// fingerprint.
//
// # Metrics
//
//	idem.client.operations               {operation}  counter: calls that drove an operation, when they return,
//	                                                  by idem.call, idem.operation.scope, idem.state, error.type
//	idem.client.attempts                 {attempt}    histogram: attempts a call sent (calls that sent any), same attributes
//	idem.client.operation.duration       s            histogram: time a call took to a definitive answer
//	                                                  (succeeded or rejected; calls that asked the server), same attributes
//	idem.client.settlements              {operation}  counter: unknown outcomes settled, by idem.settled_by
//	                                                  (status_check or resend) and idem.operation.scope
//	idem.client.expirations              {operation}  counter: operations a call moved to expired, by
//	                                                  idem.operation.scope and error.type
//	idem.client.lease.takeovers          {operation}  counter: leases Resume took over, by idem.operation.scope
//	idem.client.journal.commit.duration  s            histogram: journal commits (JournalCommitHook), by idem.journal.durable
//	idem.client.journal.commit.writes    {write}      histogram: writes per journal commit, by idem.journal.durable
//	idem.server.requests                 {request}    counter: keyed requests, by idem.outcome and http.response.status_code
//	idem.server.takeovers                {request}    counter: runs that took over a key whose holder was presumed dead
//	idem.server.store_failures           {request}    counter: key store failures, by idem.outcome
//
// # What is never recorded
//
// No attribute holds a body, a header value, a credential, the URL's path
// or query (server.address and server.port only), or a key: a key is
// recorded as idem.key.hash, the first 8 bytes of SHA-256 of scope and key
// (KeyHash, the key_hash of the server middleware's logs too), which finds
// the client's and the server's spans of one operation without handing
// anyone a key to replay. The operation's ID is
// the caller's name for it and often holds a business identifier (a cart,
// an order, a customer): it is recorded only with WithOperationID. The
// client's scope is recorded (idem.operation.scope): it is the tenant the
// client acts for (idem.Config.Scope, journaled as it is, never a
// credential), which a back end may count by. The server's scope is not:
// server.Config.Scope may return the caller's credential, so the server's
// spans carry idem.operation.scope only when WithServerTenant maps the
// scope to a tenant name, and the server's metrics never carry it, as a
// server may have very many tenants.
package otel
