package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemmcp "github.com/idemkit/idem/mcp"
)

// A key is one call with one set of arguments: "the same key with other
// arguments is CodeKeyReused". The later rounds of a call that asked for
// input are kept under a key of their own (K+"#continued"), whose first
// use fixes their arguments; nothing compares them with the first
// round's. So a call keyed K made with arguments A, which asked for
// input, can be continued with arguments B, and the tool does its work
// with B under K (a stateless server, protocol 2026-07-28, whose client
// sends each round itself).
func TestGuardALaterRoundWithOtherArgumentsIsKeyReused(t *testing.T) {
	var mu sync.Mutex
	var sentTo []string
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if req.Params.RequestState == "" {
			return &mcp.CallToolResult{RequestState: "confirm-1", InputRequests: mcp.InputRequestMap{"confirm": &mcp.ElicitParams{Message: "send it?",
				RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}}}}}, nil
		}
		var in emailIn
		if err := json.Unmarshal(req.Params.Arguments, &in); err != nil {
			return nil, err
		}
		mu.Lock()
		sentTo = append(sentTo, in.To)
		mu.Unlock()
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sent to " + in.To}}}, nil
	})
	s.AddReceivingMiddleware(newGuard(t, idemmcp.GuardConfig{}).Middleware)
	url := httptestServer(t, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true}))

	// Raw JSON-RPC, as a client that handles the rounds itself does.
	round := func(to, state string) (result map[string]any, rpcErr *jsonrpc.Error) {
		params := map[string]any{"name": "send_email", "arguments": map[string]any{"to": to},
			"_meta": map[string]any{idemmcp.MetaKey: "call_k", "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": map[string]any{"elicitation": map[string]any{}}, "io.modelcontextprotocol/clientInfo": map[string]any{"name": "agent", "version": "1"}}}
		if state != "" {
			params["requestState"] = state
			params["inputResponses"] = map[string]any{"confirm": map[string]any{"action": "accept", "content": map[string]any{}}}
		}
		b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", "tools/call")
		req.Header.Set("Mcp-Name", "send_email")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		var msg struct {
			Result map[string]any `json:"result"`
			Error  *jsonrpc.Error `json:"error"`
		}
		require.NoError(t, json.Unmarshal(body, &msg), "%d %s", res.StatusCode, body)
		t.Logf("round to=%s state=%q: %s", to, state, body)
		return msg.Result, msg.Error
	}
	first, rerr := round("ann@example.com", "")
	require.Nil(t, rerr)
	state, _ := first["requestState"].(string)
	require.NotEmpty(t, state, "the first round asks for input")

	_, rerr = round("mallory@example.com", state)
	if assert.NotNil(t, rerr, "the key's later round with other arguments ran the tool") {
		assert.EqualValues(t, idemmcp.CodeKeyReused, rerr.Code)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, sentTo, "the tool did its work under key call_k with arguments the key was never used with")
}
