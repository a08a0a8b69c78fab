package otel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/server"
)

const (
	metricServerRequests      = "idem.server.requests"
	metricServerTakeovers     = "idem.server.takeovers"
	metricServerStoreFailures = "idem.server.store_failures"
)

// ServerHooks returns a function for server.Config.OnOutcome that records
// what the middleware did with each keyed request:
//
//   - on the span in the request's context, the application's HTTP server
//     span (from otelhttp, say, in front of the middleware): idem.outcome
//     (ran, replayed, in_progress, key_reused, key_invalid,
//     store_unavailable), idem.key.hash (KeyHash of the scope and the key,
//     the key_hash of the middleware's logs), idem.took_over and
//     idem.store_failed when true, and idem.operation.scope only with
//     WithServerTenant: the scope may be a credential, and is never
//     recorded as it is. A request without a recording span gets none;
//     this package starts no span of its own.
//   - idem.server.requests ({request}), by idem.outcome and
//     http.response.status_code: claims that ran the handler, replays, 409s
//     (in_progress), 422s (key_reused), refusals;
//   - idem.server.takeovers ({request}): runs that took over a key whose
//     holder was presumed dead;
//   - idem.server.store_failures ({request}), by idem.outcome: the key
//     store failed to claim (nothing ran) or to keep a response.
//
// The metrics carry no scope: a server may have many tenants. Only
// WithMeterProvider and WithServerTenant apply.
func ServerHooks(opts ...Option) func(context.Context, server.Outcome) {
	cfg := newConfig(opts)
	m := cfg.meterProvider.Meter(instrumentationName)
	requests, err := m.Int64Counter(metricServerRequests, metric.WithUnit("{request}"),
		metric.WithDescription("Keyed requests, by what the idempotency middleware did with them (idem.outcome)."))
	handle(err)
	takeovers, err := m.Int64Counter(metricServerTakeovers, metric.WithUnit("{request}"),
		metric.WithDescription("Requests that ran the handler again for a key whose holder was presumed dead."))
	handle(err)
	storeFailures, err := m.Int64Counter(metricServerStoreFailures, metric.WithUnit("{request}"),
		metric.WithDescription("Requests for which the key store failed: to claim the key (nothing ran), or to keep the response."))
	handle(err)
	return func(ctx context.Context, o server.Outcome) {
		kind := keyOutcome.String(o.Kind.String())
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			attrs := make([]attribute.KeyValue, 0, 5)
			attrs = append(attrs, kind)
			if cfg.serverTenant != nil && o.Scope != "" {
				if tenant := cfg.serverTenant(o.Scope); tenant != "" {
					attrs = append(attrs, keyScope.String(tenant))
				}
			}
			if o.Key != "" {
				attrs = append(attrs, keyKeyHash.String(KeyHash(o.Scope, o.Key)))
			}
			if o.TookOver {
				attrs = append(attrs, keyTookOver.Bool(true))
			}
			if o.StoreFailed {
				attrs = append(attrs, keyStoreFailed.Bool(true))
			}
			span.SetAttributes(attrs...)
		}
		requests.Add(ctx, 1, metric.WithAttributes(kind, keyStatusCode.Int(o.Status)))
		if o.TookOver {
			takeovers.Add(ctx, 1)
		}
		if o.StoreFailed {
			storeFailures.Add(ctx, 1, metric.WithAttributes(kind))
		}
	}
}
