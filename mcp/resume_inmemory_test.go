package mcp_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemmcp "github.com/idemkit/idem/mcp"
	"github.com/idemkit/idem/server"
)

// Resume in another runtime on the same journal, while a Call is live:
// the live call is not sent a second time.
func TestCallerResumeLeavesALiveCallAlone(t *testing.T) {
	path := t.TempDir() + "/calls.db"
	m := &mailServer{release: make(chan struct{}), started: make(chan struct{}, 2)}
	var sent atomic.Int64
	url := serveMail(t, m, newGuard(t, idemmcp.GuardConfig{}), countToolCalls(&sent))
	a := openCaller(t, openSQLiteAt(t, path), url)
	b := openCaller(t, openSQLiteAt(t, path), url)
	done := make(chan error, 1)
	go func() {
		_, err := a.Call(context.Background(), "call_live", "send_email", emailIn{To: "x"})
		done <- err
	}()
	<-m.started
	report, err := b.Resume(context.Background())
	require.NoError(t, err)
	assert.Zero(t, report.Succeeded, "%+v", report)
	close(m.release)
	require.NoError(t, <-done)
	assert.EqualValues(t, 1, sent.Load(), "sent once")
	assert.EqualValues(t, 1, m.runs.Load())
}

// The Guard on an in-memory transport (as on stdio: no token, one
// client): refused without a Scope, kept with one.
func TestGuardInMemoryTransport(t *testing.T) {
	for _, scoped := range []bool{false, true} {
		m := &mailServer{}
		cfg := idemmcp.GuardConfig{Store: server.NewMemoryStore(), Tools: []string{"send_email"}}
		if scoped {
			cfg.Scope = func(context.Context, *mcp.CallToolRequest) string { return "the-one-client" }
		}
		g, err := idemmcp.NewGuard(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = g.Close() })
		st, ct := mcp.NewInMemoryTransports()
		ss, err := m.server(t, g).Connect(context.Background(), st, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = ss.Close() })
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(context.Background(), ct, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = cs.Close() })
		for range 2 {
			_, err = call(cs, "k", emailIn{To: "x"})
			if !scoped {
				var we *jsonrpc.Error
				require.ErrorAs(t, err, &we)
				assert.EqualValues(t, idemmcp.CodeNoCaller, we.Code)
			} else {
				require.NoError(t, err)
			}
		}
		assert.EqualValues(t, map[bool]int64{false: 0, true: 1}[scoped], m.runs.Load())
	}
}

// renewFails is a store whose lock renewals fail while fail is set: a
// store that is briefly unreachable.
type renewFails struct {
	server.Store
	fail atomic.Bool
}

func (s *renewFails) Renew(ctx context.Context, scope, key string, token int64, now time.Time) error {
	if s.fail.Load() {
		return errors.New("store unreachable")
	}
	return s.Store.Renew(ctx, scope, key, token, now)
}

// A tool the Guard told to stop (its lock could not be renewed) that
// fails for it: the failure is the interruption's, not the call's. As the
// server middleware does for an HTTP handler, it is not stored, and the
// key, once its lock is stale, runs the call again, instead of answering
// "context canceled" for it forever.
func TestGuardToolInterruptedByItsLockIsNotStoredAsItsOutcome(t *testing.T) {
	store := &renewFails{Store: server.NewMemoryStore()}
	store.fail.Store(true)
	var runs atomic.Int64
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if runs.Add(1) == 1 {
			<-ctx.Done() // told to stop
			return nil, ctx.Err()
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sent"}}}, nil
	})
	s.AddReceivingMiddleware(newGuard(t, idemmcp.GuardConfig{Store: store, LockTimeout: 300 * time.Millisecond, Retention: time.Hour, Wait: time.Minute}).Middleware)
	cs := connectURL(t, newHTTPServer(t, s))
	// The first call waits while the key is held, and takes the stale
	// lock over itself.
	res, err := call(cs, "k", map[string]any{})
	require.NoError(t, err, "the call runs again once the stale lock is taken over")
	assert.Equal(t, "sent", res.Content[0].(*mcp.TextContent).Text)
	store.fail.Store(false)
	res, err = call(cs, "k", map[string]any{})
	require.NoError(t, err)
	assert.Equal(t, "sent", res.Content[0].(*mcp.TextContent).Text)
	assert.EqualValues(t, 2, runs.Load())
}
