package mcp_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
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

// A runtime serving several users keeps one journal and a Caller per
// user, each opening its sessions with that user's bearer token, all to
// one server (CallerConfig.Server "mail"). The Guard keeps keys per user.
// Bob's call loses its answers; then Alice's Caller, at its start-up,
// Resumes. In one scope (the default "mcp" of earlier builds) it took up
// Bob's pending call and sent it with Alice's token: the key is not in
// Alice's scope on the server, so the tool ran again, as Alice, a second
// effect on another user's behalf. CallerConfig.Scope is now required and
// names whose credentials Open uses: each user's Caller has its own.
func TestCallerResumeNeverSendsAnotherUsersCallWithItsCredentials(t *testing.T) {
	var mu sync.Mutex
	var sentAs []string
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		mu.Lock()
		sentAs = append(sentAs, req.Extra.TokenInfo.UserID)
		mu.Unlock()
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sent"}}}, nil
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
	var lose atomic.Bool
	lose.Store(true)
	h := auth.RequireBearerToken(verify, nil)(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	lossy := dropFirstAnswers(h, 1<<30)
	url := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if lose.Load() && r.Header.Get("Authorization") == "Bearer secret-of-bob" {
			lossy.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	}))
	j := openSQLite(t)
	callerFor := func(user string) *idemmcp.Caller {
		c, err := idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "mail", Scope: "user:" + user,
			Open: func(ctx context.Context) (*mcp.ClientSession, error) {
				return mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx,
					&mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1, HTTPClient: headerClient(http.Header{"Authorization": {"Bearer secret-of-" + user}})}, nil)
			},
			Client: idem.Config{Retry: idem.RetryPolicy{MaxAttempts: 1, MaxStatusChecks: 1, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}

	bob := callerFor("bob")
	_, err = bob.Call(context.Background(), "call_bob_1", "send_email", emailIn{To: "bob-friend@example.com"})
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.NoError(t, bob.Close()) // Bob's runtime is gone
	lose.Store(false)

	alice := callerFor("alice")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := alice.Resume(ctx, idem.ResumeWait())
	t.Logf("Alice's Resume: %+v, %v", rep, err)
	mu.Lock()
	defer mu.Unlock()
	assert.NotContains(t, sentAs, "alice", "Bob's call was sent with Alice's credentials and ran as Alice (runs as: %q)", sentAs)
	assert.Len(t, sentAs, 1, "the tool ran %d times for one call (as %q)", len(sentAs), sentAs)
}
