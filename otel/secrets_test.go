package otel_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
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
		tel.assertClean(t, where+" name", s.Name(), secrets)
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
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					points++
					check(where, dp.Attributes.ToSlice())
					for _, ex := range dp.Exemplars {
						check(where+" exemplar", ex.FilteredAttributes)
					}
				}
			case metricdata.Histogram[int64]:
				for _, dp := range d.DataPoints {
					points++
					check(where, dp.Attributes.ToSlice())
					for _, ex := range dp.Exemplars {
						check(where+" exemplar", ex.FilteredAttributes)
					}
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					points++
					check(where, dp.Attributes.ToSlice())
					for _, ex := range dp.Exemplars {
						check(where+" exemplar", ex.FilteredAttributes)
					}
				}
			default:
				t.Errorf("%s: unexpected data %T", where, m.Data)
			}
		}
	}
	assert.NotZero(t, points, "no metric data point was read")
}

func (tel *telemetry) assertClean(t *testing.T, where, value string, secrets []string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(value, s) {
			t.Errorf("%s holds a secret %q: %q", where, s, value)
		}
	}
}
