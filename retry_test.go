package idem_test

import (
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem"
)

func response(code int, header http.Header) *http.Response {
	if header == nil {
		header = http.Header{}
	}
	return &http.Response{StatusCode: code, Header: header}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	problem := http.Header{"Content-Type": {"application/problem+json"}}
	retry := func(v string) http.Header { return http.Header{"Retry-After": {v}} }
	refused := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	reset := errors.New("read: connection reset by peer")
	cases := []struct {
		name  string
		a     idem.Attempt
		want  idem.Verdict
		after time.Duration
	}{
		{"dial refused: not written", idem.Attempt{Err: refused}, idem.Retry, 0},
		{"reset after writing", idem.Attempt{Err: reset, Written: true}, idem.Unknown, 0},
		{"EOF after writing", idem.Attempt{Err: io.EOF, Written: true}, idem.Unknown, 0},
		{"timeout after writing", idem.Attempt{Err: errors.New("context deadline exceeded (Client.Timeout exceeded while awaiting headers)"), Written: true}, idem.Unknown, 0},
		{"200", idem.Attempt{Response: response(200, nil), Written: true}, idem.Succeeded, 0},
		{"201", idem.Attempt{Response: response(201, nil), Written: true}, idem.Succeeded, 0},
		{"204", idem.Attempt{Response: response(204, nil), Written: true}, idem.Succeeded, 0},
		{"303 after a POST", idem.Attempt{Response: response(303, nil), Written: true}, idem.Succeeded, 0},
		{"201 with its body cut off", idem.Attempt{Response: response(201, nil), Err: io.ErrUnexpectedEOF, Written: true}, idem.Unknown, 0},
		{"409 in progress", idem.Attempt{Response: response(409, retry("2")), Written: true}, idem.InProgress, 2 * time.Second},
		{"409 problem key reused", idem.Attempt{Response: response(409, problem), Body: []byte(`{"type":"urn:idem:problem:key-reused"}`), Written: true}, idem.KeyConflict, 0},
		{"409 bare, as many servers answer a concurrent duplicate", idem.Attempt{Response: response(409, http.Header{"Content-Type": {"text/plain"}}),
			Body: []byte(`{"error":"request with this idempotency key is already being processed"}`), Written: true}, idem.InProgress, 0},
		{"409 mentioning a mismatch, undocumented", idem.Attempt{Response: response(409, nil), Body: []byte(`{"error":"error_params_mismatch"}`), Written: true}, idem.InProgress, 0},
		{"409 atomic phases mismatch", idem.Attempt{Response: response(409, nil), Body: []byte(`{"error":{"message":"There was a mismatch between this request's parameters and the parameters of a previously stored request with the same Idempotency-Key."}}`), Written: true}, idem.KeyConflict, 0},
		{"409 replayed: the handler's own stored answer", idem.Attempt{Response: response(409, http.Header{"Idempotent-Replayed": {"true"}}), Written: true}, idem.Rejected, 0},
		{"409 replayed (Idempotency-Replayed)", idem.Attempt{Response: response(409, http.Header{"Idempotency-Replayed": {"true"}}), Written: true}, idem.Rejected, 0},
		{"422 plain validation error", idem.Attempt{Response: response(422, nil), Body: []byte(`{"error":"quantity must be positive"}`), Written: true}, idem.Rejected, 0},
		{"422 hono-idempotency fingerprint mismatch", idem.Attempt{Response: response(422, problem), Body: []byte(`{"type":"https://hono-idempotency.dev/errors/fingerprint-mismatch","status":422}`), Written: true}, idem.KeyConflict, 0},
		{"422 gopotency mismatch", idem.Attempt{Response: response(422, http.Header{"Content-Type": {"text/plain; charset=utf-8"}}), Body: []byte(`{"error":"request with same idempotency key has different content"}` + "\n"), Written: true}, idem.KeyConflict, 0},
		{"422 problem key reused", idem.Attempt{Response: response(422, problem), Body: []byte(`{"type":"urn:idem:problem:key-reused"}`), Written: true}, idem.KeyConflict, 0},
		{"422 validation problem", idem.Attempt{Response: response(422, problem), Body: []byte(`{"type":"https://api.example.com/problems/invalid-quantity"}`), Written: true}, idem.Rejected, 0},
		{"417 without a documented body", idem.Attempt{Response: response(417, nil), Written: true}, idem.Rejected, 0},
		{"400 idem key-reused problem", idem.Attempt{Response: response(400, problem), Body: []byte(`{"type":"urn:idem:problem:key-reused"}`), Written: true}, idem.KeyConflict, 0},
		{"400 mentioning idempotency_error in text", idem.Attempt{Response: response(400, nil), Body: []byte(`not json: idempotency_error`), Written: true}, idem.Rejected, 0},
		{"307 to another origin, not followed", idem.Attempt{Response: response(307, http.Header{"Location": {"https://elsewhere.example/orders"}}), Written: true}, idem.Rejected, 0},
		{"400 stripe idempotency_error", idem.Attempt{Response: response(400, nil), Body: []byte(`{"error":{"type":"idempotency_error"}}`), Written: true}, idem.KeyConflict, 0},
		{"400 validation", idem.Attempt{Response: response(400, nil), Body: []byte(`{"error":"quantity must be positive"}`), Written: true}, idem.Rejected, 0},
		{"404", idem.Attempt{Response: response(404, nil), Written: true}, idem.Rejected, 0},
		{"403", idem.Attempt{Response: response(403, nil), Written: true}, idem.Rejected, 0},
		{"301 redirect", idem.Attempt{Response: response(301, nil), Written: true}, idem.Rejected, 0},
		{"429 with Retry-After", idem.Attempt{Response: response(429, retry("3")), Written: true}, idem.Retry, 3 * time.Second},
		{"401 refused before processing", idem.Attempt{Response: response(401, nil), Written: true}, idem.Retry, 0},
		{"503 with Retry-After", idem.Attempt{Response: response(503, retry("1")), Written: true}, idem.RetrySameKey, time.Second},
		{"500", idem.Attempt{Response: response(500, nil), Written: true}, idem.RetrySameKey, 0},
		{"502", idem.Attempt{Response: response(502, nil), Written: true}, idem.RetrySameKey, 0},
		{"408", idem.Attempt{Response: response(408, nil), Written: true}, idem.RetrySameKey, 0},
		{"500 replayed from the store", idem.Attempt{Response: response(500, http.Header{"Idempotent-Replayed": {"true"}}), Written: true}, idem.Rejected, 0},
		{"500 replayed (X- header)", idem.Attempt{Response: response(500, http.Header{"X-Idempotent-Replayed": {"true"}}), Written: true}, idem.Rejected, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := idem.Classify(c.a)
			assert.Equal(t, c.want, d.Verdict, "reason: %s", d.Reason)
			assert.Equal(t, c.after, d.RetryAfter)
			assert.NotEmpty(t, d.Reason)
		})
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	h := func(v string) http.Header { return http.Header{"Retry-After": {v}} }
	assert.Equal(t, 5*time.Second, idem.RetryAfter(h("5"), now))
	assert.Equal(t, 90*time.Second, idem.RetryAfter(h("Sun, 29 Nov 2026 12:01:30 GMT"), now))
	assert.Zero(t, idem.RetryAfter(h("Sun, 29 Nov 2026 11:59:00 GMT"), now), "a date in the past")
	assert.Zero(t, idem.RetryAfter(h("-3"), now))
	assert.Zero(t, idem.RetryAfter(h("soon"), now))
	assert.Zero(t, idem.RetryAfter(http.Header{}, now))
	assert.Equal(t, 24*time.Hour, idem.RetryAfter(h("99999999999"), now), "absurd values are capped")
}
