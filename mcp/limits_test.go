package mcp_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	idemmcp "github.com/idemkit/idem/mcp"
)

// Two Idempotency-Key headers on one request: which is the key? The
// server middleware refuses such a request; so does the Guard.
func TestGuardRefusesTwoKeyHeaders(t *testing.T) {
	m := &mailServer{}
	url := newHTTPServer(t, m.server(t, newGuard(t, idemmcp.GuardConfig{})))
	cs := connectWith(t, url, headerClient(http.Header{"Idempotency-Key": {"a", "b"}}))
	_, err := call(cs, "", emailIn{To: "x"})
	var we *jsonrpc.Error
	require.ErrorAs(t, err, &we)
	assert.EqualValues(t, idemmcp.CodeKeyInvalid, we.Code)
	assert.Contains(t, we.Message, "Idempotency-Key")
	assert.Zero(t, m.runs.Load())
}

// Arguments of exactly MaxArgumentBytes run; one byte more is refused,
// saying the limit; and so for a tool whose name JSON escapes.
func TestGuardArgumentLimit(t *testing.T) {
	for _, name := range []string{"send_email", "<send&email>"} {
		var runs atomic.Int64
		s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
		s.AddTool(&mcp.Tool{Name: name, InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			runs.Add(1)
			return &mcp.CallToolResult{}, nil
		})
		s.AddReceivingMiddleware(newGuard(t, idemmcp.GuardConfig{Tools: []string{name}, MaxArgumentBytes: 1000}).Middleware)
		cs := connectURL(t, newHTTPServer(t, s))
		args := func(n int) json.RawMessage { return json.RawMessage(`{"s":"` + strings.Repeat("x", n-8) + `"}`) }
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args(1000), Meta: mcp.Meta{idemmcp.MetaKey: "k1"}})
		require.NoError(t, err, name)
		_, err = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args(1001), Meta: mcp.Meta{idemmcp.MetaKey: "k2"}})
		var we *jsonrpc.Error
		require.ErrorAs(t, err, &we, name)
		assert.Contains(t, we.Message, "1000 bytes", name)
		assert.EqualValues(t, 1, runs.Load(), name)
	}
}

// The Caller against a stateless streamable server (each request its own
// session): a lost answer is settled with one run, and the call ID stays
// the call's, another tool under it refused.
func TestCallerStatelessServer(t *testing.T) {
	j := openSQLite(t)
	m := &mailServer{}
	s := m.server(t, newGuard(t, idemmcp.GuardConfig{}))
	url := httptestServer(t, dropFirstAnswers(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true}), 1))
	c := openCaller(t, j, url)
	res, err := c.Call(context.Background(), "call_1", "send_email", emailIn{To: "ann@example.com"})
	require.NoError(t, err)
	assert.Equal(t, "msg-1", structured(t, res).MessageID)
	assert.EqualValues(t, 1, m.runs.Load())
	_, err = c.Call(context.Background(), "call_1", "ping", emailIn{To: "ann@example.com"})
	assert.ErrorIs(t, err, idem.ErrFingerprintMismatch)
}
