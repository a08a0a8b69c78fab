package mcp_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemmcp "github.com/idemkit/idem/mcp"
)

// encoding/json matches an object's member names to a struct's fields
// without regard to case, the last one named winning: a tool that reads
// its raw arguments into a struct reads {"to":A,"To":B} as to=B and
// {"To":B,"to":A} as to=A. Canonical writes both as the same text (two
// distinct members, sorted), so a second call with the key and other
// effective arguments is answered with the first one's result, where it
// must be CodeKeyReused (or refused as ambiguous, as a member named twice
// is).
func TestGuardArgumentsThatDifferOnlyInTheCaseOfAMemberNameAreNotTheSame(t *testing.T) {
	var mu sync.Mutex
	var sentTo []string
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
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
	cs := connectURL(t, newHTTPServer(t, s))

	a := json.RawMessage(`{"to":"ann@example.com","To":"bob@example.com"}`)
	b := json.RawMessage(`{"To":"bob@example.com","to":"ann@example.com"}`)
	ca, errA := idemmcp.Canonical(a)
	cb, errB := idemmcp.Canonical(b)
	t.Logf("canonical: %s (%v) and %s (%v)", ca, errA, cb, errB)
	if errA != nil || errB != nil {
		// Refused as ambiguous, as a member named twice is: then the
		// Guard refuses both calls, and the tool never runs.
		require.ErrorContains(t, errA, "ambiguous")
		require.ErrorContains(t, errB, "ambiguous")
		for _, args := range []json.RawMessage{a, b} {
			_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_email", Arguments: args, Meta: mcp.Meta{idemmcp.MetaKey: "k"}})
			var we *jsonrpc.Error
			require.ErrorAs(t, err, &we, "%s", args)
			assert.EqualValues(t, jsonrpc.CodeInvalidParams, we.Code, "%s", args)
		}
		mu.Lock()
		defer mu.Unlock()
		assert.Empty(t, sentTo, "the tool ran on arguments refused as ambiguous")
		return
	}

	first, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_email", Arguments: a, Meta: mcp.Meta{idemmcp.MetaKey: "k"}})
	require.NoError(t, err)
	second, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_email", Arguments: b, Meta: mcp.Meta{idemmcp.MetaKey: "k"}})
	if err != nil {
		var we *jsonrpc.Error
		require.ErrorAs(t, err, &we)
		assert.Contains(t, []int64{idemmcp.CodeKeyReused, jsonrpc.CodeInvalidParams}, we.Code)
		return
	}
	t.Logf("first: %q; second: %q; the tool read %q", first.Content[0].(*mcp.TextContent).Text, second.Content[0].(*mcp.TextContent).Text, sentTo)
	assert.Fail(t, "the same key with arguments the tool reads otherwise was answered with the first call's result",
		"the first call's tool read to=%s; the second call (to=ann@example.com as the tool reads it) got %q, replayed=%v",
		sentTo[0], second.Content[0].(*mcp.TextContent).Text, second.Meta[idemmcp.MetaReplayed])
}

// The Caller journals the canonical arguments and sends them, not the
// runtime's: for arguments whose member names differ only in case, the
// canonical order is not the written one, and a tool that reads them into
// a struct (the last name matching a field wins) reads another value
// than the runtime wrote. Then the same tool-call ID with the members in
// the other order is the same call to the journal
// (no idem.ErrFingerprintMismatch), and answered with the first result.
func TestCallerSendsTheArgumentsTheRuntimeWroteWhenMemberNamesDifferInCase(t *testing.T) {
	var mu sync.Mutex
	var sentTo []string
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
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
	c := openCaller(t, openSQLite(t), newHTTPServer(t, s))

	// As written, a struct reads to=bob@example.com.
	written := json.RawMessage(`{"to":"ann@example.com","To":"bob@example.com"}`)
	var want emailIn
	require.NoError(t, json.Unmarshal(written, &want))

	res, err := c.Call(context.Background(), "call_case", "send_email", written)
	if err != nil {
		// Refusing such arguments as ambiguous keeps the promise too.
		return
	}
	mu.Lock()
	got := sentTo[0]
	mu.Unlock()
	assert.Equal(t, want.To, got, "the tool read other arguments than the runtime wrote (%s)", res.Content[0].(*mcp.TextContent).Text)
}
