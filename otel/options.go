package otel

import (
	gotel "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// instrumentationName names this package's tracer and meter.
const instrumentationName = "github.com/idemkit/idem/otel"

// An Option configures ClientHooks, ServerHooks and JournalCommitHook;
// each says which it applies to.
type Option func(*config)

type config struct {
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	propagator     propagation.TextMapPropagator
	operationID    bool
	serverTenant   func(scope string) string
}

// WithTracerProvider sets where spans go. Defaults to the global provider
// (otel.GetTracerProvider), read when the hooks are built: a provider set
// globally later is used too, as the global one delegates to it.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracerProvider = tp }
}

// WithMeterProvider sets where metrics go. Defaults to the global provider
// (otel.GetMeterProvider).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meterProvider = mp }
}

// WithPropagator sets how the trace context is written on each request
// (Hooks.Propagate). Defaults to the global propagator
// (otel.GetTextMapPropagator), which sends nothing until the application
// sets one: propagation.TraceContext{} sends traceparent. Whatever it
// writes goes on the wire (baggage too, if it propagates baggage) but is
// never journaled nor part of the fingerprint.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.propagator = p }
}

// WithOperationID adds the operation's ID (Op.ID) to the client's spans as
// idem.operation.id. It is off by default: the ID is the caller's name for
// the operation and often carries a business identifier ("checkout/cart-42",
// an order or customer number) that a tracing back end should not hold.
// Turn it on only when the IDs carry nothing of the kind.
func WithOperationID() Option {
	return func(c *config) { c.operationID = true }
}

// WithServerTenant records a tenant on the server's spans, as
// idem.operation.scope: tenant(scope) for each keyed request, left out
// when it returns "". Without it ServerHooks records no scope, because
// server.Config.Scope may be the caller's credential (an API key), which
// must not reach a tracing back end; idem.key.hash, which mixes the scope
// in, still finds a request's spans and log lines.
//
// Pass a function that maps the scope to something that is not a secret:
// the tenant or account a credential belongs to, or, when Config.Scope
// already returns a tenant name, the scope itself. It runs on the
// request's goroutine after the response was written; keep it quick.
func WithServerTenant(tenant func(scope string) string) Option {
	return func(c *config) { c.serverTenant = tenant }
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.tracerProvider == nil {
		c.tracerProvider = gotel.GetTracerProvider()
	}
	if c.meterProvider == nil {
		c.meterProvider = gotel.GetMeterProvider()
	}
	if c.propagator == nil {
		c.propagator = gotel.GetTextMapPropagator()
	}
	return c
}

// handle reports an error met while creating an instrument: the API then
// returns a working no-op instrument, so the hooks go on without it.
func handle(err error) {
	if err != nil {
		gotel.Handle(err)
	}
}
