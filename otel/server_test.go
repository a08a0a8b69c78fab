package otel_test

import (
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	idemotel "github.com/idemkit/idem/otel"
	"github.com/idemkit/idem/server"
)

var errInjected = errors.New("injected store failure")

// faultyStore wraps a real store and fails its claims, completions or
// renewals on command, as a lost connection to the store would.
type faultyStore struct {
	server.Store
	failClaims, failCompletes, failRenewals atomic.Bool
}

func (s *faultyStore) Claim(ctx context.Context, req server.ClaimRequest) (server.ClaimResult, error) {
	if s.failClaims.Load() {
		return server.ClaimResult{}, errInjected
	}
	return s.Store.Claim(ctx, req)
}

func (s *faultyStore) Complete(ctx context.Context, req server.CompleteRequest) error {
	if s.failCompletes.Load() {
		return errInjected
	}
	return s.Store.Complete(ctx, req)
}

func (s *faultyStore) Renew(ctx context.Context, scope, key string, token int64, now time.Time) error {
	if s.failRenewals.Load() {
		return errInjected
	}
	return s.Store.Renew(ctx, scope, key, token, now)
}

// serverEnv is an API behind the middleware with the server hooks, in
// server spans, on a loopback server.
type serverEnv struct {
	t       *testing.T
	tel     *telemetry
	store   *faultyStore
	url     string
	entered chan struct{} // a held request reached the handler
	release chan struct{} // lets held requests go
}

func newServerEnv(t *testing.T) *serverEnv {
	t.Helper()
	// The scope is a tenant name: recorded as it is.
	return newServerEnvWith(t, func(r *http.Request) string { return r.Header.Get("X-Tenant") }, nil,
		idemotel.WithServerTenant(func(scope string) string { return scope }))
}

// newServerEnvWith is newServerEnv with its own Scope, and the
// middleware's logs written to logs when not nil.
func newServerEnvWith(t *testing.T, scope func(*http.Request) string, logs io.Writer, opts ...idemotel.Option) *serverEnv {
	t.Helper()
	e := &serverEnv{t: t, tel: newTelemetry(t), store: &faultyStore{Store: server.NewMemoryStore()},
		entered: make(chan struct{}, 1), release: make(chan struct{})}
	var logger *slog.Logger
	if logs != nil {
		logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	mw, err := server.New(server.Config{Store: e.store, Scope: scope, Logger: logger,
		LockTimeout: 300 * time.Millisecond, RetryAfter: 50 * time.Millisecond,
		OnOutcome: idemotel.ServerHooks(append([]idemotel.Option{idemotel.WithMeterProvider(e.tel.mp)}, opts...)...)})
	require.NoError(t, err)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			// A handler that ignores its context, as a slow one stuck in
			// a call would: held until the test lets it go.
			e.entered <- struct{}{}
			<-e.release
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"order_id":"ord_1"}`)
	})
	srv := httptest.NewUnstartedServer(e.tel.serverSpans(mw.Handler(app)))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	e.url = srv.URL
	t.Cleanup(func() {
		srv.Close()
		assert.NoError(t, mw.Close())
	})
	return e
}

// send sends a request with key (none when empty) and body, and returns
// the status, or an error.
func (e *serverEnv) send(key, body string, header ...string) (int, error) {
	req, err := http.NewRequest(http.MethodPost, e.url+"/orders", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Tenant", "acme")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Body.Close()
}

// post sends, and returns the status once the server span of the request
// has ended, with that span: the n-th to end.
func (e *serverEnv) post(n int, key, body string) (int, sdktrace.ReadOnlySpan) {
	e.t.Helper()
	status, err := e.send(key, body)
	require.NoError(e.t, err)
	spans := e.tel.waitSpans(e.t, n)
	return status, spans[n-1]
}

func TestServerHooks(t *testing.T) {
	t.Parallel()
	e := newServerEnv(t)
	const key1, key2, key3, body = "key-secret-0001", "key-secret-0002", "key-secret-0003", `{"card":"4242-secret-body"}`

	status, span := e.post(1, key1, body)
	require.Equal(t, http.StatusCreated, status)
	a := attrs(span)
	assert.Equal(t, "ran", a["idem.outcome"].AsString())
	assert.Equal(t, "acme", a["idem.operation.scope"].AsString())
	assert.Equal(t, idemotel.KeyHash("acme", key1), a["idem.key.hash"].AsString())
	assert.NotContains(t, a, "idem.took_over")

	status, span = e.post(2, key1, body)
	require.Equal(t, http.StatusCreated, status)
	assert.Equal(t, "replayed", attrs(span)["idem.outcome"].AsString())

	status, span = e.post(3, key1, `{"other":"payload"}`)
	require.Equal(t, http.StatusUnprocessableEntity, status)
	assert.Equal(t, "key_reused", attrs(span)["idem.outcome"].AsString())

	status, span = e.post(4, "", body)
	require.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, "key_invalid", attrs(span)["idem.outcome"].AsString())
	assert.NotContains(t, attrs(span), "idem.key.hash", "no key")

	// A held key: another request with it gets 409.
	held := make(chan int, 1)
	go func() {
		status, err := e.send(key2, body, "X-Hold", "1")
		assert.NoError(t, err)
		held <- status
	}()
	<-e.entered
	status, span = e.post(5, key2, body)
	require.Equal(t, http.StatusConflict, status)
	assert.Equal(t, "in_progress", attrs(span)["idem.outcome"].AsString())

	// The holder loses its store (its lock is not renewed): once the lock
	// is stale, the next request takes the key over and runs.
	e.store.failRenewals.Store(true)
	n := 5
	for {
		n++
		status, span = e.post(n, key2, body)
		if status != http.StatusConflict {
			break
		}
		time.Sleep(20 * time.Millisecond) // pace the polls
	}
	e.store.failRenewals.Store(false)
	require.Equal(t, http.StatusCreated, status)
	a = attrs(span)
	assert.Equal(t, "ran", a["idem.outcome"].AsString())
	assert.True(t, a["idem.took_over"].AsBool())
	close(e.release)
	assert.Equal(t, http.StatusConflict, <-held, "the fenced first run answers 409")
	n++ // the held request's span
	e.tel.waitSpans(t, n)

	// The store fails to keep a response: the client is told to retry.
	e.store.failCompletes.Store(true)
	n++
	status, span = e.post(n, key3, body)
	e.store.failCompletes.Store(false)
	require.Equal(t, http.StatusConflict, status)
	assert.True(t, attrs(span)["idem.store_failed"].AsBool())

	// The store refuses the claim: nothing runs.
	e.store.failClaims.Store(true)
	n++
	status, span = e.post(n, "key-secret-0004", body)
	e.store.failClaims.Store(false)
	require.Equal(t, http.StatusServiceUnavailable, status)
	assert.Equal(t, "store_unavailable", attrs(span)["idem.outcome"].AsString())
	assert.True(t, attrs(span)["idem.store_failed"].AsBool())

	tel := e.tel
	outcome := func(kind string, code int) int64 {
		return tel.count(t, "idem.server.requests", attribute.String("idem.outcome", kind), attribute.Int("http.response.status_code", code))
	}
	assert.Equal(t, int64(1), outcome("replayed", http.StatusCreated))
	assert.Equal(t, int64(1), outcome("key_reused", http.StatusUnprocessableEntity))
	assert.Equal(t, int64(1), outcome("key_invalid", http.StatusBadRequest))
	assert.Equal(t, int64(1), outcome("store_unavailable", http.StatusServiceUnavailable))
	assert.Equal(t, int64(2), outcome("ran", http.StatusCreated), "key1's run and the take-over")
	assert.Equal(t, int64(2), outcome("ran", http.StatusConflict), "the fenced run and the response the store failed to keep")
	// Spans 1-4 came before the hold; the take-over, the held run and the
	// two store failures came after the 409s.
	assert.Equal(t, int64(n-8), outcome("in_progress", http.StatusConflict), "every 409 before the take-over")
	assert.Equal(t, int64(n), tel.count(t, "idem.server.requests"), "one per keyed request")
	assert.Equal(t, int64(1), tel.count(t, "idem.server.takeovers"))
	assert.Equal(t, int64(1), tel.count(t, "idem.server.store_failures", attribute.String("idem.outcome", "ran")))
	assert.Equal(t, int64(1), tel.count(t, "idem.server.store_failures", attribute.String("idem.outcome", "store_unavailable")))
	tel.assertNothingSecret(t, []string{key1, key2, key3, "key-secret-0004", "4242-secret-body", "/orders"})
}

// Without a recording span in the context, the hooks set nothing and
// still count.
func TestServerHooksWithoutASpan(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	hook := idemotel.ServerHooks(idemotel.WithMeterProvider(tel.mp))
	hook(context.Background(), server.Outcome{Kind: server.OutcomeRan, Scope: "acme", Key: "k", Status: http.StatusCreated})
	assert.Equal(t, int64(1), tel.count(t, "idem.server.requests", attribute.String("idem.outcome", "ran")))
	assert.Empty(t, tel.spans.Ended())
}
