package otel_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
	idemotel "github.com/idemkit/idem/otel"
)

// telemetry is the OpenTelemetry SDK as an application sets it up, with
// every span kept in memory and metrics read on demand.
type telemetry struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider

	mu sync.Mutex
	// headers are the headers of the requests the server received, by
	// route ("POST /orders", "GET /idempotency/{key}").
	headers map[string][]http.Header
}

func newTelemetry(t *testing.T) *telemetry {
	t.Helper()
	tel := &telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader(),
		headers: map[string][]http.Header{}}
	tel.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tel.spans))
	tel.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	t.Cleanup(func() {
		_ = tel.tp.Shutdown(context.Background())
		_ = tel.mp.Shutdown(context.Background())
	})
	return tel
}

// options point the hooks at this telemetry, with the W3C propagator.
func (tel *telemetry) options(more ...idemotel.Option) []idemotel.Option {
	return append([]idemotel.Option{idemotel.WithTracerProvider(tel.tp), idemotel.WithMeterProvider(tel.mp),
		idemotel.WithPropagator(propagation.TraceContext{})}, more...)
}

func (tel *telemetry) clientHooks(more ...idemotel.Option) idem.Hooks {
	return idemotel.ClientHooks(tel.options(more...)...)
}

// route names a test server request by its route, never its raw path.
func route(r *http.Request) string {
	if strings.HasPrefix(r.URL.Path, "/idempotency/") {
		return r.Method + " /idempotency/{key}"
	}
	return r.Method + " " + r.URL.Path
}

// serverSpans is what an application's HTTP instrumentation (otelhttp)
// does in front of the middleware: it reads the trace context the request
// carries and runs the request in a server span, its child.
func (tel *telemetry) serverSpans(next http.Handler) http.Handler {
	tracer := tel.tp.Tracer("test-http-server")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rt := route(r)
		tel.mu.Lock()
		tel.headers[rt] = append(tel.headers[rt], r.Header.Clone())
		tel.mu.Unlock()
		ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tracer.Start(ctx, rt, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// headerOf returns the values of header name on the requests to route.
func (tel *telemetry) headerOf(rt, name string) []string {
	tel.mu.Lock()
	defer tel.mu.Unlock()
	var values []string
	for _, h := range tel.headers[rt] {
		values = append(values, h.Get(name))
	}
	return values
}

func (tel *telemetry) traceparentsOf(rt string) []string { return tel.headerOf(rt, "Traceparent") }

// startServer starts the orders test server behind the idempotency
// middleware with the server hooks, in server spans.
func (tel *telemetry) startServer(t *testing.T, opts ...testserver.Option) *testserver.Server {
	t.Helper()
	opts = append(opts, testserver.WithWrap(tel.serverSpans),
		testserver.WithOnOutcome(idemotel.ServerHooks(idemotel.WithMeterProvider(tel.mp))))
	return testserver.Start(t, opts...)
}

// waitSpans waits until n spans have ended: a server span ends once the
// handler returns, which may be after the client read the answer.
func (tel *telemetry) waitSpans(t *testing.T, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	require.Eventually(t, func() bool { return len(tel.spans.Ended()) >= n }, 10*time.Second, time.Millisecond,
		"waiting for %d spans to end", n)
	spans := tel.spans.Ended()
	require.Len(t, spans, n, "spans: %v", spanNames(spans))
	return spans
}

func spanNames(spans []sdktrace.ReadOnlySpan) []string {
	names := make([]string, len(spans))
	for i, s := range spans {
		names[i] = s.Name()
	}
	return names
}

// named returns the spans called name, in the order they ended.
func named(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func one(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	got := named(spans, name)
	require.Len(t, got, 1, "spans called %q among %v", name, spanNames(spans))
	return got[0]
}

// attrs returns a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[string]attribute.Value {
	m := map[string]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value
	}
	return m
}

func isChildOf(child, parent sdktrace.ReadOnlySpan) bool {
	return child.Parent().SpanID() == parent.SpanContext().SpanID() &&
		child.SpanContext().TraceID() == parent.SpanContext().TraceID()
}

// traceparentOf is the W3C traceparent that names span.
func traceparentOf(s sdktrace.ReadOnlySpan) string {
	sc := s.SpanContext()
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

func (tel *telemetry) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, tel.reader.Collect(context.Background(), &rm))
	return rm
}

func (tel *telemetry) metric(t *testing.T, name string) (metricdata.Metrics, bool) {
	t.Helper()
	for _, sm := range tel.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// has reports whether set holds every one of want.
func has(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// count sums the data points of counter name whose attributes hold want.
func (tel *telemetry) count(t *testing.T, name string, want ...attribute.KeyValue) int64 {
	t.Helper()
	m, ok := tel.metric(t, name)
	if !ok {
		return 0
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok, "%s is a %T, not an int64 counter", name, m.Data)
	var n int64
	for _, dp := range sum.DataPoints {
		if has(dp.Attributes, want) {
			n += dp.Value
		}
	}
	return n
}

// histogram returns the count and sum of the data points of histogram name
// whose attributes hold want.
func (tel *telemetry) histogram(t *testing.T, name string, want ...attribute.KeyValue) (count uint64, sum float64) {
	t.Helper()
	m, ok := tel.metric(t, name)
	if !ok {
		return 0, 0
	}
	switch h := m.Data.(type) {
	case metricdata.Histogram[int64]:
		for _, dp := range h.DataPoints {
			if has(dp.Attributes, want) {
				count, sum = count+dp.Count, sum+float64(dp.Sum)
			}
		}
	case metricdata.Histogram[float64]:
		for _, dp := range h.DataPoints {
			if has(dp.Attributes, want) {
				count, sum = count+dp.Count, sum+dp.Sum
			}
		}
	default:
		t.Fatalf("%s is a %T, not a histogram", name, m.Data)
	}
	return count, sum
}

func fastRetry() idem.RetryPolicy {
	return idem.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, MaxRetryAfter: 20 * time.Millisecond}
}
