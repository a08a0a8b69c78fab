package mcp_test

import (
	"context"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	idemmcp "github.com/idemkit/idem/mcp"
)

// A call is "sent" when it is handed to the session, whatever the
// session's transport: over one that is not HTTP (stdio, in memory), a
// call the server ran and never answered is an unknown outcome, not one
// the server cannot have seen.
func TestCallerOverANonHTTPTransportMarksASentCallSent(t *testing.T) {
	m := &mailServer{started: make(chan struct{}, 1), release: make(chan struct{})}
	s := m.server(t, newGuard(t, idemmcp.GuardConfig{}))
	j := openSQLite(t)
	c, err := idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "mail", Scope: "mcp",
		Open: func(ctx context.Context) (*mcp.ClientSession, error) {
			st, ct := mcp.NewInMemoryTransports()
			if _, err := s.Connect(ctx, st, nil); err != nil {
				return nil, err
			}
			return mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, ct, nil)
		}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-m.started // the tool runs: the call reached the server
		cancel()
	}()
	_, err = c.Call(ctx, "call_mem", "send_email", emailIn{To: "ann@example.com"})
	require.Error(t, err)
	assert.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the call reached the server: its outcome is unknown")
	rec, err := j.Lookup(context.Background(), "mcp", "call_mem")
	require.NoError(t, err)
	assert.Contains(t, []idem.State{idem.StateUnknown, idem.StateInFlight}, rec.State, "not pending: the server may have run it")
	assert.Equal(t, 1, rec.Attempts)

	close(m.release)
	res, err := c.Call(context.Background(), "call_mem", "send_email", emailIn{To: "ann@example.com"})
	require.NoError(t, err)
	assert.Equal(t, "msg-1", structured(t, res).MessageID)
	assert.EqualValues(t, 1, m.runs.Load())
}

// go-sdk's own HTTP requests (opening the session, the streamable
// transport's POSTs) are not re-sends of the tool call: the journal
// counts one attempt and no re-sends by the HTTP transport.
func TestCallerCountsNoResendsForGoSDKsOwnRequests(t *testing.T) {
	m := &mailServer{}
	j := openSQLite(t)
	c := openCaller(t, j, serveMail(t, m, newGuard(t, idemmcp.GuardConfig{}), nil))
	_, err := c.Call(context.Background(), "call_one", "send_email", emailIn{To: "ann@example.com"})
	require.NoError(t, err)
	rec, err := j.Lookup(context.Background(), "mcp", "call_one")
	require.NoError(t, err)
	assert.Equal(t, 1, rec.Attempts)
	assert.Zero(t, rec.TransportResends, "the session's own HTTP requests are not re-sends of the call")
}
