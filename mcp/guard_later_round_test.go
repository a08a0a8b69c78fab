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

// sender is a tool that does its work at once, never asking for input,
// and counts its runs.
func sender(runs *atomic.Int64) mcp.ToolHandler {
	return func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		runs.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sent"}}}, nil
	}
}

func guardedSender(t *testing.T, runs *atomic.Int64) *mcp.ClientSession {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, sender(runs))
	s.AddReceivingMiddleware(newGuard(t, idemmcp.GuardConfig{}).Middleware)
	return connectURL(t, newHTTPServer(t, s))
}

// A call whose first round ended it (the tool did its work without
// asking for input) is done for its key. The same call sent again with a
// requestState or input responses (a runtime replaying a transcript that
// carries a stale state, or any client) must be answered with the stored
// result, not run the tool a second time under the same key.
func TestGuardALaterRoundOfAFinishedCallDoesNotRunTheToolAgain(t *testing.T) {
	var runs atomic.Int64
	cs := guardedSender(t, &runs)
	args := map[string]any{"to": "ann@example.com"}
	_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_email", Arguments: args,
		Meta: mcp.Meta{idemmcp.MetaKey: "call_done"}})
	require.NoError(t, err)
	require.EqualValues(t, 1, runs.Load())

	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_email", Arguments: args,
		Meta: mcp.Meta{idemmcp.MetaKey: "call_done"}, RequestState: "stale-state"})
	require.NoError(t, err)
	assert.EqualValues(t, 1, runs.Load(), "the tool ran again under a key whose call had ended")
	assert.Equal(t, true, res.Meta[idemmcp.MetaReplayed], "a second answer under the key is not marked replayed")
}

// Two keys are two calls: the later rounds of one must never be answered
// from another key's entry. The Guard keeps a later round of key K under
// K+"#continued", a spelling that is itself a valid key of 1 to 255
// printable ASCII characters: the first round of a call keyed
// "call_x#continued" and a later round of the call keyed "call_x" share
// one entry.
func TestGuardKeysDoNotAliasTheLaterRoundsOfAnotherKey(t *testing.T) {
	var runs atomic.Int64
	cs := guardedSender(t, &runs)
	args := map[string]any{"to": "ann@example.com"}
	_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_email", Arguments: args,
		Meta: mcp.Meta{idemmcp.MetaKey: "call_x#continued"}})
	require.NoError(t, err)
	require.EqualValues(t, 1, runs.Load())

	// Another call, under its own key, in a later round: the tool must
	// run for it.
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_email", Arguments: args,
		Meta: mcp.Meta{idemmcp.MetaKey: "call_x"}, RequestState: "state-1"})
	require.NoError(t, err)
	assert.Nil(t, res.Meta[idemmcp.MetaReplayed], "the call keyed call_x was answered with the result of the call keyed call_x#continued")
	assert.EqualValues(t, 2, runs.Load(), "the tool did not run for the call keyed call_x")
}
