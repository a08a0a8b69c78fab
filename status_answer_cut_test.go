package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A stored answer longer than Config.MaxResponseBytes, read through the
// status endpoint, is cut at MaxResponseBytes and the cut noted, as the
// same answer received directly is: the operation is settled, not left
// unknown for good.
func TestAStoredAnswerOverMaxResponseBytesIsCutAsADirectOne(t *testing.T) {
	t.Parallel()
	const limit = 4 << 10
	answer := bytes.Repeat([]byte("<é>"), limit/4+100) // longer than the limit, and escaped in JSON
	var writes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if key, ok := strings.CutPrefix(r.URL.Path, "/idempotency/"); ok {
			st, _ := json.Marshal(map[string]any{"key": key, "state": "completed", "response": map[string]any{
				"status": 201, "body": string(answer)}})
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(st)
			return
		}
		writes.Add(1)
		dropConn(w)
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/idempotency"),
		Retry: fastRetry(), MaxResponseBytes: limit})
	ctx := context.Background()
	res, err := c.Do(ctx, orderOp("op-1", 1))
	assert.Equal(t, int32(1), writes.Load())
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, res.StatusCode)
	assert.Equal(t, answer[:limit], res.Body)
	rec, err := c.Lookup(ctx, "default", "op-1")
	require.NoError(t, err)
	assert.Contains(t, rec.LastError, "response body cut at 4096 bytes")
}
