package mcp_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemmcp "github.com/idemkit/idem/mcp"
)

// The Idempotency-Key header keys one HTTP request; a JSON-RPC batch
// (accepted by go-sdk's streamable HTTP for protocol 2025-03-26 and
// earlier) carries several tool calls in one. Each of them reads the
// header as its own key: two calls meant as two (two reminders, two
// payments of the same amount) become one, the second answered with the
// first's result, marked replayed, the tool run once. A header key on a
// batch of guarded calls is not one call's key: it must be refused
// (CodeKeyInvalid) or every call run.
func TestGuardHeaderKeyOnABatchIsNotEveryCallsKey(t *testing.T) {
	var runs atomic.Int64
	s := mcp.NewServer(&mcp.Implementation{Name: "pay", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, sender(&runs))
	s.AddReceivingMiddleware(newGuard(t, idemmcp.GuardConfig{}).Middleware)
	url := httptestServer(t, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true}))

	batch := `[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"send_email","arguments":{"to":"ann@example.com"}}},` +
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"send_email","arguments":{"to":"ann@example.com"}}}]`
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(batch))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Idempotency-Key", `"batch-1"`)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(res.Body)
	require.NoError(t, res.Body.Close())
	require.NoError(t, err)
	t.Logf("%d %s", res.StatusCode, body)
	require.Equal(t, http.StatusOK, res.StatusCode, "the batch was not taken: %s", body)
	if strings.Contains(string(body), "-32084") {
		return // refused: keeps the promise
	}
	assert.NotContains(t, string(body), idemmcp.MetaReplayed, "the second call of the batch was answered as a replay of the first")
	assert.EqualValues(t, 2, runs.Load(), "two calls in a batch, the tool ran once")
}
