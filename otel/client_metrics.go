package otel

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem"
)

// Instrument names, units and bucket boundaries. Units follow
// OpenTelemetry's conventions: seconds for durations, {thing} for counts.
const (
	metricOperations  = "idem.client.operations"
	metricAttempts    = "idem.client.attempts"
	metricDuration    = "idem.client.operation.duration"
	metricSettlements = "idem.client.settlements"
	metricExpirations = "idem.client.expirations"
	metricTakeovers   = "idem.client.lease.takeovers"
)

var (
	// durationBuckets: OpenTelemetry's HTTP defaults, and beyond, for
	// calls that wait out a server's Retry-After.
	durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60, 300}
	attemptBuckets  = []float64{1, 2, 3, 4, 5, 6, 8, 10, 15, 20}
)

type clientMetrics struct {
	operations  metric.Int64Counter
	attempts    metric.Int64Histogram
	duration    metric.Float64Histogram
	settlements metric.Int64Counter
	expirations metric.Int64Counter
	takeovers   metric.Int64Counter
}

func newClientMetrics(m metric.Meter) clientMetrics {
	var cm clientMetrics
	var err error
	cm.operations, err = m.Int64Counter(metricOperations, metric.WithUnit("{operation}"),
		metric.WithDescription("Operations driven by a call (Do, Send, Resume), counted when the call returns, by the state it left them in."))
	handle(err)
	cm.attempts, err = m.Int64Histogram(metricAttempts, metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts a call sent for its operation, for calls that sent any."),
		metric.WithExplicitBucketBoundaries(attemptBuckets...))
	handle(err)
	cm.duration, err = m.Float64Histogram(metricDuration, metric.WithUnit("s"),
		metric.WithDescription("Time a call took to get its operation a definitive answer (succeeded or rejected), for calls that asked the server."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	handle(err)
	cm.settlements, err = m.Int64Counter(metricSettlements, metric.WithUnit("{operation}"),
		metric.WithDescription("Operations whose outcome was unknown and got a definitive answer, by how (idem.settled_by: status_check or resend)."))
	handle(err)
	cm.expirations, err = m.Int64Counter(metricExpirations, metric.WithUnit("{operation}"),
		metric.WithDescription("Operations moved to expired, for an operator to reconcile: their retention passed unconfirmed, or the server did not honour their key (error.type)."))
	handle(err)
	cm.takeovers, err = m.Int64Counter(metricTakeovers, metric.WithUnit("{operation}"),
		metric.WithDescription("Operations whose lease Resume took over from an owner that was gone or whose lease had lapsed."))
	handle(err)
	return cm
}

func (m clientMetrics) takeover(ctx context.Context, call idem.Call) {
	m.takeovers.Add(ctx, 1, metric.WithAttributes(keyScope.String(call.Scope)))
}

func (m clientMetrics) callEnd(ctx context.Context, call idem.Call, end idem.CallEnd, state, errType string, took time.Duration) {
	attrs := make([]attribute.KeyValue, 0, 4)
	attrs = append(attrs, keyCall.String(call.Kind.String()), keyScope.String(call.Scope))
	if state != "" {
		attrs = append(attrs, keyState.String(state))
	}
	if errType != "" {
		attrs = append(attrs, keyErrorType.String(errType))
	}
	set := metric.WithAttributeSet(attribute.NewSet(attrs...))
	m.operations.Add(ctx, 1, set)
	if end.Attempts > 0 {
		m.attempts.Record(ctx, int64(end.Attempts), set)
	}
	sent := end.Attempts+end.StatusChecks > 0
	if sent && (end.State == idem.StateSucceeded || end.State == idem.StateRejected) {
		m.duration.Record(ctx, took.Seconds(), set)
	}
	if end.Settled != idem.SettledDirectly {
		m.settlements.Add(ctx, 1, metric.WithAttributes(keyScope.String(call.Scope), keySettledBy.String(end.Settled.String())))
	}
	if end.Expired {
		m.expirations.Add(ctx, 1, metric.WithAttributes(keyScope.String(call.Scope), keyErrorType.String(errType)))
	}
}
