package mcp_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemmcp "github.com/idemkit/idem/mcp"
)

// A Caller's calls share the session's connections as go-sdk's own calls
// do: the end of a call (the client's attempt context, canceled when the
// attempt returns) must not cut the connection go-sdk still reads the
// answer's stream from, which would make every call dial anew.
func TestCallerReusesTheSessionsConnections(t *testing.T) {
	m := &mailServer{}
	s := m.server(t, newGuard(t, idemmcp.GuardConfig{}))
	srv := httptest.NewUnstartedServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	var conns atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c := openCaller(t, openSQLite(t), srv.URL)
	const calls = 100
	for i := range calls {
		_, err := c.Call(context.Background(), fmt.Sprint("call_", i), "send_email", emailIn{To: "ann@example.com"})
		require.NoError(t, err)
	}
	// go-sdk opens a session with up to 3 (initialize, the initialized
	// notification, the standalone stream); one more may be dialled when
	// an idle one closes.
	assert.LessOrEqual(t, conns.Load(), int64(5), "%d connections for %d calls", conns.Load(), calls)
}
