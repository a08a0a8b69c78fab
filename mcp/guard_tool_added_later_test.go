package mcp_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemmcp "github.com/idemkit/idem/mcp"
)

// go-sdk servers add tools at any time (tools/list_changed). A guarded
// call that reaches the server before its tool is added is answered by
// go-sdk "unknown tool": the tool never ran, nothing was done. The Guard
// stores that answer as the key's outcome, so the call sent again with its
// key once the tool is there is answered "unknown tool" again, for the
// store's Retention, and never runs. The same holds in a rolling deploy
// on a shared store: a replica still on the version without the tool
// answers first, and the replicas with it replay that answer.
func TestGuardAnUnknownToolIsNotTheKeysOutcome(t *testing.T) {
	var runs atomic.Int64
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	// A tool that is there from the start, so that the server serves
	// tools/call at all.
	s.AddTool(&mcp.Tool{Name: "ping", InputSchema: map[string]any{"type": "object"}}, sender(new(atomic.Int64)))
	s.AddReceivingMiddleware(newGuard(t, idemmcp.GuardConfig{}).Middleware)
	cs := connectURL(t, newHTTPServer(t, s))
	p := &mcp.CallToolParams{Name: "send_email", Arguments: map[string]any{"to": "ann@example.com"}, Meta: mcp.Meta{idemmcp.MetaKey: "early"}}
	_, err := cs.CallTool(context.Background(), p)
	require.Error(t, err, "the tool is not there yet")
	t.Logf("before the tool was added: %v", err)

	s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, sender(&runs))
	res, err := cs.CallTool(context.Background(), p)
	assert.NoError(t, err, "the call sent again once its tool is there")
	if err == nil {
		assert.False(t, res.IsError)
	}
	assert.EqualValues(t, 1, runs.Load(), "the tool never ran for the key")
}
