package mcp_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
