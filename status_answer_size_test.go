package idem_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// The status endpoint carries the stored answer inside a JSON envelope: its
// body as a JSON string (every quote escaped) or base64, with its headers
// around it. An answer the client would take whole from the server
// directly, well within Config.MaxResponseBytes, comes back from the
// status endpoint larger than MaxResponseBytes, and the client refuses
// every such status answer as too large: the operation, applied once and
// answered, stays unknown for as long as anyone asks, and ends expired,
// for an operator. Its status check must settle it (cut at
// MaxResponseBytes at worst, as a direct answer would be).
func TestAStoredAnswerWithinMaxResponseBytesIsSettledByTheStatusEndpoint(t *testing.T) {
	t.Parallel()
	const limit = 64 << 10
	// A JSON answer of 56 KiB, seven eighths of the limit: a list of
	// short strings, as an API's list answer is.
	items := make([]string, 0, 12<<10)
	for len(items)*5 < 56<<10 {
		items = append(items, "a1")
	}
	answer, err := json.Marshal(items)
	require.NoError(t, err)
	require.Less(t, len(answer), limit)

	var writes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if key, ok := strings.CutPrefix(r.URL.Path, "/idempotency/"); ok {
			st, _ := json.Marshal(map[string]any{"key": key, "state": "completed", "response": map[string]any{
				"status": 201, "header": http.Header{"Content-Type": {"application/json"}}, "body": string(answer)}})
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(st)
			return
		}
		writes.Add(1)
		dropConn(w) // applied; the answer is lost
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/idempotency"),
		Retry: fastRetry(), MaxResponseBytes: limit})
	res, err := c.Do(context.Background(), orderOp("op-1", 1))
	assert.Equal(t, int32(1), writes.Load())
	require.NoError(t, err, fmt.Sprintf("a %d-byte answer, within MaxResponseBytes (%d), could not be read from the status endpoint", len(answer), limit))
	assert.Equal(t, http.StatusCreated, res.StatusCode)
	assert.Equal(t, answer, res.Body)
}
