package mcp_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	idemmcp "github.com/idemkit/idem/mcp"
	"github.com/idemkit/idem/server"
)

// Two users' Callers on one journal, one server, each with its own bearer
// token in Open and (CallerConfig.Scope being required, and naming whose
// credentials Open uses) a scope of its own; in one scope, the default of
// earlier builds, the following went wrong. Their runtimes name tool
// calls as they like; two conversations that both have a "call_1" (a runtime that
// numbers its calls, a replayed test transcript) with the same arguments
// are one operation to the journal: Bob's call is answered with Alice's
// result from the journal, his e-mail never sent, and Alice's result
// shown to him. The Guard keeps its keys per user for this reason; the
// Caller's journal must too.
func TestCallerUsersWithTheSameToolCallIDNeverShareAResult(t *testing.T) {
	var mu sync.Mutex
	var sentAs []string
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		user := req.Extra.TokenInfo.UserID
		mu.Lock()
		sentAs = append(sentAs, user)
		mu.Unlock()
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sent for " + user}}}, nil
	})
	g, err := idemmcp.NewGuard(idemmcp.GuardConfig{Store: server.NewMemoryStore(), Tools: []string{"send_email"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close() })
	s.AddReceivingMiddleware(g.Middleware)
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		user, ok := strings.CutPrefix(token, "secret-of-")
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: user, Expiration: time.Now().Add(time.Hour)}, nil
	}
	url := httptestServer(t, auth.RequireBearerToken(verify, nil)(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)))
	j := openSQLite(t)
	callerFor := func(user string) *idemmcp.Caller {
		c, err := idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "mail", Scope: "user:" + user,
			Open: func(ctx context.Context) (*mcp.ClientSession, error) {
				return mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx,
					&mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1, HTTPClient: headerClient(http.Header{"Authorization": {"Bearer secret-of-" + user}})}, nil)
			}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	alice, bob := callerFor("alice"), callerFor("bob")
	args := map[string]any{"to": "team@example.com", "subject": "standup"}
	a, err := alice.Call(context.Background(), "call_1", "send_email", args)
	require.NoError(t, err)
	b, err := bob.Call(context.Background(), "call_1", "send_email", args)
	if err != nil {
		// Refused (another caller's ID) rather than answered: the promise holds.
		assert.NotContains(t, err.Error(), "sent for alice")
		return
	}
	assert.Equal(t, "sent for alice", a.Content[0].(*mcp.TextContent).Text)
	assert.NotEqual(t, "sent for alice", b.Content[0].(*mcp.TextContent).Text, "Bob was answered with Alice's result")
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, sentAs, "bob", "Bob's call never ran (runs as %q)", sentAs)
}

// A Caller has no default scope: the credentials are hidden in Open, so
// it cannot tell two identities apart, and says what to give. Nor does it
// resume another scope, whose calls it would send with its credentials.
func TestCallerNeedsAScopeOfItsOwn(t *testing.T) {
	j := openSQLite(t)
	open := func(context.Context) (*mcp.ClientSession, error) { return nil, nil }
	_, err := idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "mail", Open: open})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CallerConfig.Scope is empty")
	assert.Contains(t, err.Error(), "whose credentials Open connects with")
	_, err = idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "mail", Open: open, Scope: "user:alice",
		Client: idem.Config{ResumeScopes: []string{"user:alice", "user:bob"}}})
	assert.ErrorContains(t, err, "resumes its own Scope only")
}
