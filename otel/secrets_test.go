package otel_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
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
