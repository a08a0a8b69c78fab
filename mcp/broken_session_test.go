package mcp_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	idemmcp "github.com/idemkit/idem/mcp"
)

// When one call's attempt times out on a session that another call is
// still waiting on, the session is dropped; closing it must not hold up
// the runtime's next calls, which open a new session at once, however
// long the waiting call's tool runs.
func TestABrokenSessionDoesNotHoldUpTheNextCalls(t *testing.T) {
	j := openSQLite(t)
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	s := mcp.NewServer(&mcp.Implementation{Name: "slow", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "slow"}, func(_ context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, struct{}, error) {
		<-release // a tool that does not heed its context
		return nil, struct{}{}, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "ping"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, struct{}, error) {
		return nil, struct{}{}, nil
	})
	url := newHTTPServer(t, s)
	c, err := idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "slow", Scope: "mcp",
		Open: func(ctx context.Context) (*mcp.ClientSession, error) {
			return mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).
				Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil)
		},
		Client: idem.Config{AttemptTimeout: 2 * time.Second,
			Retry: idem.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond, MaxAttempts: 1, MaxStatusChecks: 1}}})
	require.NoError(t, err)
	t.Cleanup(func() { free(); _ = c.Close() })

	// A call whose tool runs on: its attempt times out after 2 s and the
	// session is dropped while the tool still runs.
	waiting := make(chan struct{})
	go func() {
		defer close(waiting)
		_, _ = c.Call(context.Background(), "call_slow", "slow", struct{}{})
	}()

	done := make(chan error, 1)
	go func() {
		// After the slow call's attempt timed out (on a machine so busy
		// that it has not yet, the call shares the live session and the
		// test passes without telling anything).
		time.Sleep(3 * time.Second)
		// Its step has a deadline of its own, as an agent's does: the
		// dropped session's close (go-sdk's waits on the pending call)
		// must not eat it.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		began := time.Now()
		_, err := c.Call(ctx, "call_ping", "ping", struct{}{})
		t.Logf("the next call took %v", time.Since(began))
		done <- err
	}()
	select {
	case err := <-done:
		assert.NoError(t, err, "the next call went through a new session at once")
	case <-time.After(time.Minute):
		t.Fatal("the next call waited on the dropped session's close")
	}
	free()
	<-waiting
}
