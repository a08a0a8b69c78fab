package mcp_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	idemmcp "github.com/idemkit/idem/mcp"
)

// A tool's result larger than the idem.Client's MaxResponseBytes (4 MiB
// by default: a file's contents, an image in base64) is cut in the
// journal, and the call settled with the cut body. Call then answers an
// error that the answer "does not parse", naming no limit, and the tool's
// result is lost for good: the same tool-call ID is answered from the
// journal with the same error (Result too), while the Guard still holds
// the whole result. Either the result reaches the runtime, or the error
// says that it was too large and how to raise the limit.
func TestCallerAResultLargerThanMaxResponseBytes(t *testing.T) {
	var runs atomic.Int64
	big := strings.Repeat("x", 5<<20)
	s := mcp.NewServer(&mcp.Implementation{Name: "files", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		runs.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: big}}}, nil
	})
	s.AddReceivingMiddleware(newGuard(t, idemmcp.GuardConfig{}).Middleware)
	c := openCaller(t, openSQLite(t), newHTTPServer(t, s))

	for i := range 2 {
		res, err := c.Call(context.Background(), "call_big", "send_email", map[string]any{})
		if err != nil {
			assert.Contains(t, err.Error(), "MaxResponseBytes", "call %d: the error says nothing of the size: %.300v", i+1, err)
			continue
		}
		require.Len(t, res.Content, 1)
		assert.Equal(t, len(big), len(res.Content[0].(*mcp.TextContent).Text), "call %d", i+1)
	}
	assert.EqualValues(t, 1, runs.Load())
}

// A result over MaxResponseBytes is left unsettled, not lost: a Caller
// with a higher limit on the same journal settles the call with the
// whole result, which the server replays under the key.
func TestCallerAResultTooLargeIsSettledAfterTheLimitIsRaised(t *testing.T) {
	var runs atomic.Int64
	big := strings.Repeat("y", 64<<10)
	s := mcp.NewServer(&mcp.Implementation{Name: "files", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "read_file", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		runs.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: big}}}, nil
	})
	s.AddReceivingMiddleware(newGuard(t, idemmcp.GuardConfig{Tools: []string{"read_file"}}).Middleware)
	url := newHTTPServer(t, s)
	j := openSQLite(t)
	callerWith := func(limit int64) *idemmcp.Caller {
		c, err := idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "files", Scope: "agent",
			Open: func(ctx context.Context) (*mcp.ClientSession, error) {
				return mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil)
			},
			Client: idem.Config{MaxResponseBytes: limit, Retry: idem.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	small := callerWith(32 << 10)
	_, err := small.Call(context.Background(), "call_read", "read_file", map[string]any{})
	require.ErrorIs(t, err, idemmcp.ErrResultTooLarge)
	_, err = small.Result(context.Background(), "call_read")
	require.ErrorIs(t, err, idemmcp.ErrNotSettled)
	require.NoError(t, small.Close())

	res, err := callerWith(1<<20).Call(context.Background(), "call_read", "read_file", map[string]any{})
	require.NoError(t, err)
	require.Len(t, res.Content, 1)
	assert.Equal(t, big, res.Content[0].(*mcp.TextContent).Text)
	assert.EqualValues(t, 1, runs.Load())
}
