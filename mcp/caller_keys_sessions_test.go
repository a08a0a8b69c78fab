package mcp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	idemmcp "github.com/idemkit/idem/mcp"
)

// One call given up (its context canceled) does not break the session
// another call of the same Caller is waiting on: that one is answered on
// its first send.
func TestCallerCanceledCallLeavesOthersAlone(t *testing.T) {
	j := openSQLite(t)
	m := &mailServer{release: make(chan struct{}), started: make(chan struct{}, 2)}
	c := openCaller(t, j, serveMail(t, m, newGuard(t, idemmcp.GuardConfig{}), nil))
	ctx, cancel := context.WithCancel(context.Background())
	errA := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, "call_a", "send_email", emailIn{To: "a"})
		errA <- err
	}()
	<-m.started
	errB := make(chan error, 1)
	go func() {
		_, err := c.Call(context.Background(), "call_b", "send_email", emailIn{To: "b"})
		errB <- err
	}()
	<-m.started
	cancel()
	require.Error(t, <-errA)
	close(m.release)
	require.NoError(t, <-errB)
	rec, err := j.Lookup(context.Background(), "mcp", "call_b")
	require.NoError(t, err)
	assert.Equal(t, 1, rec.Attempts, "call_b's session was not closed under it")
	assert.EqualValues(t, 2, m.runs.Load())
}

// Result of a call that is journaled but not settled says so in a way a
// runtime can test.
func TestCallerResultOfAnUnsettledCall(t *testing.T) {
	j := openSQLite(t)
	var opens atomic.Int64
	c, err := idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "mail", Scope: "mcp",
		Open: func(context.Context) (*mcp.ClientSession, error) {
			opens.Add(1)
			return nil, assert.AnError
		},
		Client: idem.Config{Retry: idem.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond, MaxAttempts: 1}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Call(context.Background(), "call_1", "send_email", emailIn{To: "x"})
	require.Error(t, err)
	_, err = c.Result(context.Background(), "call_1")
	assert.ErrorIs(t, err, idemmcp.ErrNotSettled)
	_, err = c.Result(context.Background(), "call_never")
	assert.ErrorIs(t, err, idem.ErrNotFound)
}

// Tool names with bytes that mean something in a URL reach the server as
// they were named.
func TestCallerOddToolNames(t *testing.T) {
	j := openSQLite(t)
	names := []string{"ns/send_email", "send email", "a?b#c", "100%", "ünï"}
	var seen []string
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	for _, n := range names {
		s.AddTool(&mcp.Tool{Name: n, InputSchema: map[string]any{"type": "object"}}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			seen = append(seen, req.Params.Name)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: req.Params.Name}}}, nil
		})
	}
	s.AddReceivingMiddleware(newGuard(t, idemmcp.GuardConfig{Tools: names}).Middleware)
	c := openCaller(t, j, newHTTPServer(t, s))
	for i, n := range names {
		res, err := c.Call(context.Background(), "call_"+string(rune('a'+i)), n, map[string]any{})
		require.NoError(t, err, n)
		assert.Equal(t, n, res.Content[0].(*mcp.TextContent).Text)
	}
	assert.Equal(t, names, seen)
}

// hangSession lets the first session's first tool call run, then never
// answers it nor anything else on that session: a connection gone silent.
// stop, closed, ends the hangs.
func hangSession(stop <-chan struct{}) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler { return hang(h, stop) }
}

func hang(h http.Handler, stop <-chan struct{}) http.Handler {
	var dead atomic.Value
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Mcp-Session-Id")
		if d, _ := dead.Load().(string); d != "" && id == d {
			wait(r, stop)
			return
		}
		if r.Method == http.MethodPost && id != "" {
			if body, _ := readAndRestore(r); strings.Contains(body, `"tools/call"`) && dead.CompareAndSwap(nil, id) {
				h.ServeHTTP(httptest.NewRecorder(), r)
				wait(r, stop)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

func wait(r *http.Request, stop <-chan struct{}) {
	select {
	case <-r.Context().Done():
	case <-stop:
	}
}

// An attempt that times out on a session gone silent leaves that session:
// the next attempt opens a new one, and the call is settled (one run).
func TestCallerLeavesASessionAnAttemptTimedOutOn(t *testing.T) {
	j := openSQLite(t)
	m := &mailServer{}
	stop := make(chan struct{})
	url := serveMail(t, m, newGuard(t, idemmcp.GuardConfig{}), hangSession(stop))
	t.Cleanup(func() { close(stop) })
	c, err := idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "mail", Scope: "mcp",
		Open: func(ctx context.Context) (*mcp.ClientSession, error) {
			return mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).
				Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil)
		},
		Client: idem.Config{AttemptTimeout: 2 * time.Second, Retry: idem.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond, MaxAttempts: 6}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	res, err := c.Call(context.Background(), "call_1", "send_email", emailIn{To: "x"})
	require.NoError(t, err)
	assert.Equal(t, "msg-1", structured(t, res).MessageID)
	assert.EqualValues(t, 1, m.runs.Load())
}

// A server that answers CodeKeyReused (the key was used for another call)
// is a key conflict, as the idem client tells it, not an answer that
// "does not parse".
func TestCallerKeyReusedAnswerIsAConflict(t *testing.T) {
	j := openSQLite(t)
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "tools/call" {
				return nil, &jsonrpc.Error{Code: idemmcp.CodeKeyReused, Message: "this idempotency key was used before with other arguments"}
			}
			return next(ctx, method, req)
		}
	})
	c := openCaller(t, j, newHTTPServer(t, s))
	_, err := c.Call(context.Background(), "call_1", "send_email", emailIn{To: "x"})
	assert.ErrorIs(t, err, idem.ErrKeyConflict)
	assert.NotContains(t, err.Error(), "does not parse")
}
