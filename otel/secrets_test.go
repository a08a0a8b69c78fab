package otel_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
	idemotel "github.com/idemkit/idem/otel"
)

// allowedKeys is every attribute key the hooks may set, on a span, a span
// link or a metric data point. A new key fails every test until it is
// added here, after a look at what it holds.
var allowedKeys = map[attribute.Key]bool{
	"http.request.method": true, "http.response.status_code": true, "server.address": true, "server.port": true,
	"error.type":           true,
	"idem.operation.scope": true, "idem.key.hash": true, "idem.call": true, "idem.lease.taken_from": true,
	"idem.state": true, "idem.attempts": true, "idem.status_checks": true, "idem.settled_by": true,
	"idem.replayed": true, "idem.expired": true,
	"idem.attempt": true, "idem.verdict": true, "idem.written": true, "idem.wait_ms": true,
	"idem.status_check": true, "idem.status.state": true, "idem.status.stored_status_code": true,
	"idem.status.replay": true, "idem.status.retry_after_ms": true,
	"idem.journal.durable": true,
	"idem.outcome":         true, "idem.took_over": true, "idem.store_failed": true,
}

// assertNothingSecret reads back every attribute of every span (its
// links' and events' too) and of every metric data point (exemplars
// included) and checks that each key is allowed and that no value, span
// name, event name or status description contains any of secrets: the
// operation's key, body, credential, header values, URL path or query, and
// ID. extra allows keys a test turned on (WithOperationID).
func (tel *telemetry) assertNothingSecret(t *testing.T, secrets []string, extra ...attribute.Key) {
	t.Helper()
	allowed := func(k attribute.Key) bool {
		for _, e := range extra {
			if k == e {
				return true
			}
		}
		return allowedKeys[k]
	}
	check := func(where string, kvs []attribute.KeyValue) {
		t.Helper()
		for _, kv := range kvs {
			assert.True(t, allowed(kv.Key), "%s: attribute %q is not on the allowlist", where, kv.Key)
			tel.assertClean(t, where+" "+string(kv.Key), kv.Value.Emit(), secrets)
		}
	}
	spans := tel.spans.Ended()
	assert.NotEmpty(t, spans)
	for _, s := range spans {
		where := "span " + s.Name()
		// The test server's spans are named by their route, as an HTTP
		// instrumentation would name them; the attributes on them are the
		// server hooks'.
		if s.InstrumentationScope().Name == "github.com/idemkit/idem/otel" {
			tel.assertClean(t, where+" name", s.Name(), secrets)
		}
		tel.assertClean(t, where+" status", s.Status().Description, secrets)
		check(where, s.Attributes())
		for _, l := range s.Links() {
			check(where+" link", l.Attributes)
		}
		for _, e := range s.Events() {
			tel.assertClean(t, where+" event", e.Name, secrets)
			check(where+" event "+e.Name, e.Attributes)
		}
	}
	points := 0
	for _, sm := range tel.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			where := "metric " + m.Name
			var ps []pointAttrs
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					ps = append(ps, attrsOf(dp.Attributes, dp.Exemplars))
				}
			case metricdata.Histogram[int64]:
				for _, dp := range d.DataPoints {
					ps = append(ps, attrsOf(dp.Attributes, dp.Exemplars))
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					ps = append(ps, attrsOf(dp.Attributes, dp.Exemplars))
				}
			default:
				t.Errorf("%s: unexpected data %T", where, m.Data)
			}
			for _, p := range ps {
				points++
				check(where, p.point)
				for _, ex := range p.exemplars {
					check(where+" exemplar", ex)
				}
			}
		}
	}
	assert.NotZero(t, points, "no metric data point was read")
}

// pointAttrs are the attributes of a metric data point and of its
// exemplars, whatever the point's type.
type pointAttrs struct {
	point     []attribute.KeyValue
	exemplars [][]attribute.KeyValue
}

func attrsOf[N int64 | float64](set attribute.Set, exemplars []metricdata.Exemplar[N]) pointAttrs {
	p := pointAttrs{point: set.ToSlice()}
	for _, ex := range exemplars {
		p.exemplars = append(p.exemplars, ex.FilteredAttributes)
	}
	return p
}

func (tel *telemetry) assertClean(t *testing.T, where, value string, secrets []string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(value, s) {
			t.Errorf("%s holds a secret %q: %q", where, s, value)
		}
	}
}

// What the application puts in its operations and credentials, each marked
// so that a leak is found wherever it lands.
const (
	secretToken  = "tok-secret-5521"
	secretHeader = "hdr-secret-8830"
	secretBody   = "body-secret-4242"
	secretPath   = "path-secret-31"
	secretID     = "cust-secret-991"
)

func markedOp(n int) idem.Op {
	return idem.Op{ID: fmt.Sprintf("%s/cart-%d", secretID, n), URL: "/orders?ref=" + secretPath,
		Header: http.Header{"Content-Type": {"application/json"}, "X-Customer": {secretHeader}},
		Body:   []byte(fmt.Sprintf(`{"item":%q,"quantity":%d}`, secretBody, n))}
}

// Every span and metric the hooks make, over the paths a call can take,
// holds only allowed keys and none of the operation's secrets.
func TestNothingSecretLeaves(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	srv := tel.startServer(t)
	authorize := func(cfg *idem.Config) {
		cfg.Authorize = func(r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+secretToken)
			return nil
		}
	}
	c, j := newClient(t, srv, tel.clientHooks(), authorize)
	replaying, _ := newClient(t, srv, tel.clientHooks(), authorize, func(cfg *idem.Config) { cfg.Status = idem.ReplayStatus() })
	var keys []string
	do := func(c *idem.Client, op idem.Op, fault ...testserver.Fault) {
		t.Helper()
		for _, f := range fault {
			srv.Inject(f)
		}
		res, err := c.Do(t.Context(), op)
		require.NoError(t, err)
		keys = append(keys, res.Key)
	}
	do(c, markedOp(1))
	do(c, markedOp(2), testserver.DropAfterCommit)
	do(replaying, markedOp(3), testserver.ResetMidBody)
	do(c, markedOp(4), testserver.ServerErrorBeforeCommit)
	o, err := c.Begin(t.Context(), markedOp(5))
	require.NoError(t, err)
	_, err = o.Send(t.Context())
	require.NoError(t, err)
	keys = append(keys, o.Key())
	rejected := markedOp(6)
	rejected.Body = []byte(secretBody + " is not JSON")
	res, err := c.Do(t.Context(), rejected)
	require.ErrorIs(t, err, idem.ErrRejected)
	keys = append(keys, res.Key)
	_, err = c.Do(t.Context(), markedOp(1)) // answered from the journal
	require.NoError(t, err)

	// The secrets were there to leak: on the wire and in the journal.
	assert.Contains(t, tel.headerOf("POST /orders", "Authorization"), "Bearer "+secretToken)
	assert.Contains(t, tel.headerOf("POST /orders", "X-Customer"), secretHeader)
	rec, err := j.Get(t.Context(), keys[0])
	require.NoError(t, err)
	assert.Contains(t, string(rec.Body), secretBody)
	assert.Contains(t, rec.URL, secretPath)
	assert.Equal(t, markedOp(1).ID, rec.ID)

	names := spanNames(tel.spans.Ended())
	assert.Contains(t, names, "idem.status_check")
	assert.Contains(t, names, "idem.send POST")
	tel.assertNothingSecret(t, append([]string{secretToken, secretHeader, secretBody, secretPath, secretID, "/orders"}, keys...))
}

// A server that scopes keys by the caller's credential, as
// server.Config.Scope allows: the credential reaches no attribute, event
// or metric of the server hooks, nor the middleware's logs, and the key's
// hash on the span is the one the logs show.
func TestNothingSecretLeavesTheServer(t *testing.T) {
	t.Parallel()
	const credential = "sk_live_secret_7731"
	var logs syncBuffer
	e := newServerEnvWith(t, func(r *http.Request) string { return r.Header.Get("Authorization") }, &logs)
	const key1, key2, key3, key4, body = "key-secret-1001", "key-secret-1002", "key-secret-1003", "key-secret-1004", `{"card":"4242-secret-body"}`
	post := func(n int, key, body string, want int) sdktrace.ReadOnlySpan {
		t.Helper()
		status, err := e.send(key, body, "Authorization", "Bearer "+credential)
		require.NoError(t, err)
		require.Equal(t, want, status)
		return e.tel.waitSpans(t, n)[n-1]
	}
	ran := post(1, key1, body, http.StatusCreated)
	post(2, key1, body, http.StatusCreated)                              // replayed
	post(3, key1, `{"other":"payload"}`, http.StatusUnprocessableEntity) // key_reused
	post(4, "", body, http.StatusBadRequest)                             // key_invalid
	held := make(chan int, 1)
	go func() {
		status, err := e.send(key2, body, "Authorization", "Bearer "+credential, "X-Hold", "1")
		assert.NoError(t, err)
		held <- status
	}()
	<-e.entered
	post(5, key2, body, http.StatusConflict) // in_progress
	close(e.release)
	assert.Equal(t, http.StatusCreated, <-held)
	e.tel.waitSpans(t, 6)
	e.store.failCompletes.Store(true)
	post(7, key3, body, http.StatusConflict) // the response not kept
	e.store.failCompletes.Store(false)
	e.store.failClaims.Store(true)
	unavailable := post(8, key4, body, http.StatusServiceUnavailable)
	e.store.failClaims.Store(false)

	// The credential was there to leak: it is the scope the keys are
	// stored under.
	a := attrs(ran)
	assert.NotContains(t, a, "idem.operation.scope", "the scope is left out unless WithServerTenant names it")
	assert.Equal(t, idemotel.KeyHash("Bearer "+credential, key1), a["idem.key.hash"].AsString())
	e.tel.assertNothingSecret(t, []string{credential, key1, key2, key3, key4, "4242-secret-body", "/orders"})

	// The middleware's logs: no credential, and the key named by the
	// same hash as on the span.
	out := logs.String()
	assert.NotContains(t, out, credential)
	assert.NotContains(t, out, key4)
	var line struct {
		Msg     string `json:"msg"`
		KeyHash string `json:"key_hash"`
	}
	found := false
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		require.NoError(t, json.Unmarshal([]byte(l), &line), "log line %q", l)
		if strings.Contains(line.Msg, "claim failed") {
			found = true
			assert.Equal(t, attrs(unavailable)["idem.key.hash"].AsString(), line.KeyHash,
				"the log's key_hash and the span's idem.key.hash of one request")
		}
	}
	assert.True(t, found, "no log line of the failed claim in %s", out)
}

// syncBuffer is a bytes.Buffer for a logger written from the server's
// goroutines and read by the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
