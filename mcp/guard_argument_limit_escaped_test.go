package mcp_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemmcp "github.com/idemkit/idem/mcp"
)

// MaxArgumentBytes is the largest canonical arguments accepted, and
// arguments within it run. The Guard serves a call to the server
// middleware as the body {"tool":…,"arguments":…} written by
// json.Marshal, which escapes <, > and & in the arguments as \u003c (6
// bytes for 1); the middleware's body limit leaves room for that in the
// tool's name only. Arguments of HTML (an e-mail's body, a page) well
// under the limit are then refused as larger than the server accepts.
func TestGuardArgumentLimitCountsTheArgumentsAsSent(t *testing.T) {
	var runs atomic.Int64
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, sender(&runs))
	s.AddReceivingMiddleware(newGuard(t, idemmcp.GuardConfig{MaxArgumentBytes: 1000}).Middleware)
	cs := connectURL(t, newHTTPServer(t, s))

	args := json.RawMessage(`{"html":"` + strings.Repeat("<p>", 200) + `"}`) // 611 bytes, canonical too
	canon, err := idemmcp.Canonical(args)
	require.NoError(t, err)
	require.Less(t, len(canon), 1000)
	_, err = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_email", Arguments: args, Meta: mcp.Meta{idemmcp.MetaKey: "html"}})
	assert.NoError(t, err, "arguments of %d canonical bytes, under MaxArgumentBytes (1000), refused", len(canon))
	assert.EqualValues(t, 1, runs.Load())
}
