package otel_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	gotel "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
	idemotel "github.com/idemkit/idem/otel"
)

// newClient returns a client of srv on a new SQLite journal, with hooks.
func newClient(t *testing.T, srv *testserver.Server, hooks idem.Hooks, mod ...func(*idem.Config)) (*idem.Client, *idem.SQLiteJournal) {
	t.Helper()
	j, err := idem.OpenSQLite(filepath.Join(t.TempDir(), "ops.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	cfg := idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.StatusURL), Retry: fastRetry(),
		AttemptTimeout: 5 * time.Second, Hooks: hooks}
	for _, m := range mod {
		m(&cfg)
	}
	c, err := idem.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c, j
}

func orderOp(id string, quantity int) idem.Op {
	return idem.Op{ID: id, URL: "/orders", Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(fmt.Sprintf(`{"item":"book","quantity":%d}`, quantity))}
}

// secretsOf lists what no telemetry of op may hold.
func secretsOf(op idem.Op, keys ...string) []string {
	return append([]string{string(op.Body), op.ID}, keys...)
}

func TestHappyCall(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	srv := tel.startServer(t)
	c, j := newClient(t, srv, tel.clientHooks())
	op := orderOp("checkout/cart-1", 1)
	res, err := c.Do(t.Context(), op)
	require.NoError(t, err)

	// The call's span, its attempt, and the server's span of the request.
	spans := tel.waitSpans(t, 3)
	call := one(t, spans, "idem.do POST")
	attempt := one(t, spans, "idem.attempt")
	served := one(t, spans, "POST /orders")
	assert.Equal(t, trace.SpanKindClient, call.SpanKind())
	assert.Equal(t, trace.SpanKindClient, attempt.SpanKind())
	assert.True(t, isChildOf(attempt, call), "the attempt is the call's child")
	assert.True(t, isChildOf(served, attempt), "the server's span is the attempt's child: the request carried the attempt's trace context")
	assert.Equal(t, []string{traceparentOf(attempt)}, tel.traceparentsOf("POST /orders"), "the server saw traceparent")

	ca := attrs(call)
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	host, port := u.Hostname(), u.Port()
	assert.Equal(t, "POST", ca["http.request.method"].AsString())
	assert.Equal(t, host, ca["server.address"].AsString())
	assert.Equal(t, port, fmt.Sprint(ca["server.port"].AsInt64()))
	assert.Equal(t, "do", ca["idem.call"].AsString())
	assert.Equal(t, "default", ca["idem.operation.scope"].AsString())
	assert.Equal(t, idemotel.KeyHash("default", res.Key), ca["idem.key.hash"].AsString())
	assert.Equal(t, "succeeded", ca["idem.state"].AsString())
	assert.Equal(t, int64(1), ca["idem.attempts"].AsInt64())
	assert.Equal(t, int64(0), ca["idem.status_checks"].AsInt64())
	assert.NotContains(t, ca, "error.type")
	assert.NotContains(t, ca, "idem.settled_by", "nothing was unknown")
	assert.Equal(t, codes.Unset, call.Status().Code)

	aa := attrs(attempt)
	assert.Equal(t, int64(1), aa["idem.attempt"].AsInt64())
	assert.Equal(t, "succeeded", aa["idem.verdict"].AsString())
	assert.Equal(t, int64(http.StatusCreated), aa["http.response.status_code"].AsInt64())
	assert.True(t, aa["idem.written"].AsBool())
	assert.False(t, aa["idem.replayed"].AsBool())
	assert.NotContains(t, aa, "idem.wait_ms", "no attempt follows")
	assert.Equal(t, "POST", aa["http.request.method"].AsString())
	assert.Equal(t, codes.Unset, attempt.Status().Code)

	sa := attrs(served)
	assert.Equal(t, "ran", sa["idem.outcome"].AsString())
	assert.Equal(t, ca["idem.key.hash"], sa["idem.key.hash"], "the server's span names the same key hash")

	// Trace context is neither journaled nor part of the fingerprint; the
	// journaled link is the call span's traceparent.
	rec, err := j.Get(t.Context(), res.Key)
	require.NoError(t, err)
	assert.Empty(t, rec.Header.Values("Traceparent"), "not journaled")
	assert.Equal(t, http.Header{"Content-Type": {"application/json"}}, rec.Header)
	assert.Equal(t, traceparentOf(call), rec.Link)
	plain, pj := newClient(t, srv, idem.Hooks{})
	res2, err := plain.Do(t.Context(), op)
	require.NoError(t, err)
	rec2, err := pj.Get(t.Context(), res2.Key)
	require.NoError(t, err)
	assert.Equal(t, rec2.Fingerprint, rec.Fingerprint, "the fingerprint is a client's without otel")
	assert.Empty(t, rec2.Link)
	tel.waitSpans(t, 4) // the plain request's server span: its outcome was reported

	// Metrics.
	ok := []attribute.KeyValue{attribute.String("idem.state", "succeeded"), attribute.String("idem.operation.scope", "default"),
		attribute.String("idem.call", "do")}
	assert.Equal(t, int64(1), tel.count(t, "idem.client.operations", ok...))
	n, sum := tel.histogram(t, "idem.client.attempts", ok...)
	assert.Equal(t, uint64(1), n)
	assert.Equal(t, 1.0, sum)
	n, sum = tel.histogram(t, "idem.client.operation.duration", ok...)
	assert.Equal(t, uint64(1), n)
	assert.Positive(t, sum)
	assert.Zero(t, tel.count(t, "idem.client.settlements"))
	assert.Equal(t, int64(2), tel.count(t, "idem.server.requests", attribute.String("idem.outcome", "ran"),
		attribute.Int("http.response.status_code", http.StatusCreated)), "this client's order and the plain one's")

	tel.assertNothingSecret(t, secretsOf(op, res.Key, res2.Key))
}

func TestLostResponseSettledByStatusCheck(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	srv := tel.startServer(t)
	c, _ := newClient(t, srv, tel.clientHooks())
	srv.Inject(testserver.DropAfterCommit)
	op := orderOp("checkout/cart-lost", 1)
	res, err := c.Do(t.Context(), op)
	require.NoError(t, err)
	assert.Equal(t, 1, srv.TotalOrders())

	spans := tel.waitSpans(t, 5)
	call := one(t, spans, "idem.do POST")
	attempt := one(t, spans, "idem.attempt")
	check := one(t, spans, "idem.status_check")
	assert.True(t, isChildOf(attempt, call))
	assert.True(t, isChildOf(check, call))
	assert.True(t, isChildOf(one(t, spans, "POST /orders"), attempt))
	assert.True(t, isChildOf(one(t, spans, "GET /idempotency/{key}"), check), "the status check carried its own span's context")

	aa := attrs(attempt)
	assert.Equal(t, codes.Error, attempt.Status().Code, "the attempt got no answer")
	assert.Equal(t, "eof", aa["error.type"].AsString(), "the connection was closed without an answer")
	assert.Equal(t, "unknown", aa["idem.verdict"].AsString())
	assert.True(t, aa["idem.written"].AsBool())
	assert.NotContains(t, aa, "http.response.status_code")

	ka := attrs(check)
	assert.Equal(t, codes.Unset, check.Status().Code)
	assert.Equal(t, int64(1), ka["idem.status_check"].AsInt64())
	assert.Equal(t, "completed", ka["idem.status.state"].AsString())
	assert.Equal(t, int64(http.StatusCreated), ka["idem.status.stored_status_code"].AsInt64())
	assert.False(t, ka["idem.status.replay"].AsBool())
	assert.False(t, check.StartTime().Before(attempt.EndTime()), "the check follows the attempt")

	ca := attrs(call)
	assert.Equal(t, "succeeded", ca["idem.state"].AsString())
	assert.Equal(t, "status_check", ca["idem.settled_by"].AsString())
	assert.Equal(t, int64(1), ca["idem.status_checks"].AsInt64())
	assert.Equal(t, codes.Unset, call.Status().Code, "the call succeeded")

	assert.Equal(t, int64(1), tel.count(t, "idem.client.settlements", attribute.String("idem.settled_by", "status_check")))
	assert.Zero(t, tel.count(t, "idem.client.settlements", attribute.String("idem.settled_by", "resend")))
	tel.assertNothingSecret(t, secretsOf(op, res.Key))
}

func TestRetryThenRejection(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	srv := tel.startServer(t)
	c, _ := newClient(t, srv, tel.clientHooks(), func(cfg *idem.Config) {
		cfg.Retry = idem.RetryPolicy{MinBackoff: 20 * time.Millisecond, MaxBackoff: 40 * time.Millisecond}
	})
	srv.Inject(testserver.ServerErrorBeforeCommit)
	op := orderOp("checkout/cart-retry", 1)
	res, err := c.Do(t.Context(), op)
	require.NoError(t, err)

	spans := tel.waitSpans(t, 5) // the call, two attempts, two server spans
	attempts := named(spans, "idem.attempt")
	require.Len(t, attempts, 2)
	first, second := attrs(attempts[0]), attrs(attempts[1])
	assert.Equal(t, int64(1), first["idem.attempt"].AsInt64())
	assert.Equal(t, int64(http.StatusInternalServerError), first["http.response.status_code"].AsInt64())
	assert.Equal(t, "500", first["error.type"].AsString())
	assert.Equal(t, "retry_same_key", first["idem.verdict"].AsString())
	assert.GreaterOrEqual(t, first["idem.wait_ms"].AsInt64(), int64(10), "the wait before the next try: at least MinBackoff/2")
	assert.Equal(t, codes.Error, attempts[0].Status().Code)
	assert.Equal(t, int64(2), second["idem.attempt"].AsInt64())
	assert.Equal(t, "succeeded", second["idem.verdict"].AsString())
	assert.NotContains(t, second, "idem.wait_ms")
	ca := attrs(one(t, spans, "idem.do POST"))
	assert.Equal(t, "resend", ca["idem.settled_by"].AsString(), "a 500 after the request was written: the same key's re-send settled it")
	n, sum := tel.histogram(t, "idem.client.attempts", attribute.String("idem.state", "succeeded"))
	assert.Equal(t, uint64(1), n)
	assert.Equal(t, 2.0, sum)

	// A definitive refusal: the call failed, and says how.
	bad := idem.Op{ID: "checkout/bad", URL: "/orders", Body: []byte(`not json`)}
	_, err = c.Do(t.Context(), bad)
	require.ErrorIs(t, err, idem.ErrRejected)
	spans = tel.waitSpans(t, 8)
	rejected := named(spans, "idem.do POST")[1]
	ra := attrs(rejected)
	assert.Equal(t, codes.Error, rejected.Status().Code)
	assert.Equal(t, "idem.ErrRejected", rejected.Status().Description)
	assert.Equal(t, "idem.ErrRejected", ra["error.type"].AsString())
	assert.Equal(t, "rejected", ra["idem.state"].AsString())
	assert.Equal(t, int64(1), tel.count(t, "idem.client.operations", attribute.String("idem.state", "rejected"),
		attribute.String("error.type", "idem.ErrRejected")))
	ra4 := attrs(named(spans, "idem.attempt")[2])
	assert.Equal(t, "rejected", ra4["idem.verdict"].AsString())
	assert.Equal(t, "400", ra4["error.type"].AsString())
	tel.assertNothingSecret(t, append(secretsOf(op, res.Key), string(bad.Body), bad.ID))
}

func TestAnOperationLeftUnknownThenExpiredIsCountedOnce(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	srv := tel.startServer(t)
	policy := fastRetry()
	policy.MaxStatusChecks = 1
	c, _ := newClient(t, srv, tel.clientHooks(), func(cfg *idem.Config) {
		cfg.Retry, cfg.Retention = policy, 50*time.Millisecond
	})
	srv.Inject(testserver.DropAfterCommit)
	srv.InjectStatus(testserver.StatusDown)
	op := orderOp("checkout/cart-expiring", 1)
	_, err := c.Do(t.Context(), op)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	time.Sleep(100 * time.Millisecond) // past the retention
	for range 2 {
		_, err = c.Do(t.Context(), op)
		require.ErrorIs(t, err, idem.ErrNeedsReconciliation)
	}

	assert.Equal(t, int64(1), tel.count(t, "idem.client.expirations", attribute.String("error.type", "idem.ErrNeedsReconciliation")),
		"the second call expired it; the third found it so")
	assert.Equal(t, int64(2), tel.count(t, "idem.client.operations", attribute.String("idem.state", "expired")))
	assert.Equal(t, int64(1), tel.count(t, "idem.client.operations", attribute.String("idem.state", "unknown"),
		attribute.String("error.type", "idem.ErrOutcomeUnknown")))
	spans := tel.waitSpans(t, 7) // 3 calls, 1 attempt, 1 status check, 2 server spans
	calls := named(spans, "idem.do POST")
	require.Len(t, calls, 3)
	assert.Equal(t, "idem.ErrOutcomeUnknown", attrs(calls[0])["error.type"].AsString())
	check := one(t, spans, "idem.status_check")
	assert.Equal(t, codes.Error, check.Status().Code, "the status endpoint was down")
	assert.Equal(t, "idem.ErrBadStatus", attrs(check)["error.type"].AsString())
	assert.True(t, attrs(calls[1])["idem.expired"].AsBool())
	assert.NotContains(t, attrs(calls[2]), "idem.expired")
	tel.assertNothingSecret(t, secretsOf(op))
}

func TestOperationIDIsOptIn(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	srv := tel.startServer(t)
	c, _ := newClient(t, srv, tel.clientHooks(idemotel.WithOperationID()))
	op := orderOp("checkout/cart-with-id", 1)
	_, err := c.Do(t.Context(), op)
	require.NoError(t, err)
	call := one(t, tel.waitSpans(t, 3), "idem.do POST")
	assert.Equal(t, "checkout/cart-with-id", attrs(call)["idem.operation.id"].AsString())
	tel.assertNothingSecret(t, []string{string(op.Body)}, "idem.operation.id")
}

// The global providers and propagator are the defaults.
func TestDefaultsAreTheGlobals(t *testing.T) {
	// Not parallel: it sets the globals, which no other test reads.
	tel := newTelemetry(t)
	// The globals cannot be set back (the global provider delegates to the
	// first one set for good); no other test uses them.
	gotel.SetTracerProvider(tel.tp)
	gotel.SetMeterProvider(tel.mp)
	gotel.SetTextMapPropagator(propagation.TraceContext{})
	srv := tel.startServer(t)
	c, _ := newClient(t, srv, idemotel.ClientHooks())
	_, err := c.Do(context.Background(), orderOp("checkout/globals", 1))
	require.NoError(t, err)
	spans := tel.waitSpans(t, 3)
	assert.True(t, isChildOf(one(t, spans, "POST /orders"), one(t, spans, "idem.attempt")), "the global propagator sent traceparent")
	assert.Equal(t, int64(1), tel.count(t, "idem.client.operations"))
}

// A Do that finds its operation journaled by an earlier call links its
// span to the call that created it.
func TestDoOfAJournaledOperationLinksItsCreator(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	srv := tel.startServer(t)
	policy := fastRetry()
	policy.MaxStatusChecks = 1
	c, _ := newClient(t, srv, tel.clientHooks(), func(cfg *idem.Config) { cfg.Retry = policy })
	srv.Inject(testserver.DropAfterCommit)
	srv.InjectStatus(testserver.StatusDown)
	op := orderOp("checkout/cart-twice", 1)
	_, err := c.Do(t.Context(), op)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	_, err = c.Do(t.Context(), op)
	require.NoError(t, err)

	calls := named(tel.spans.Ended(), "idem.do POST")
	require.Len(t, calls, 2)
	assert.Empty(t, calls[0].Links(), "the creator has no link to itself")
	require.Len(t, calls[1].Links(), 1)
	assert.Equal(t, calls[0].SpanContext().SpanID(), calls[1].Links()[0].SpanContext.SpanID())
	assert.Equal(t, calls[0].SpanContext().TraceID(), calls[1].Links()[0].SpanContext.TraceID())
	assert.Equal(t, "status_check", attrs(calls[1])["idem.settled_by"].AsString())
}
