package mcp_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemmcp "github.com/idemkit/idem/mcp"
	"github.com/idemkit/idem/server"
)

// A tool that panics, in the first round of a call and in a later one,
// on each store: the panic goes on out of the Guard (as out of the server
// middleware: go-sdk recovers none, so unrecovered it ends the server
// process, guarded or not), and what the Guard wrote for the key before
// it went on is what guard.go promises. The first round's failure is
// kept (the tool may have acted before it panicked): a retry is answered
// with an error, and the tool does not run again. A later round's key is
// released: a retry runs that round again.
func TestGuardToolThatPanicsEachRoundEachStore(t *testing.T) {
	stores := map[string]func(t *testing.T) server.Store{
		"memory": func(*testing.T) server.Store { return server.NewMemoryStore() },
		"sqlite": func(t *testing.T) server.Store {
			s, err := server.OpenSQLiteStore(filepath.Join(t.TempDir(), "keys.db"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
	}
	for name, open := range stores {
		for _, later := range []bool{false, true} {
			round := map[bool]string{false: "first", true: "later"}[later]
			t.Run(name+"/"+round, func(t *testing.T) {
				mw := newGuard(t, idemmcp.GuardConfig{Store: open(t)}).Middleware
				req := func() *mcp.CallToolRequest {
					p := &mcp.CallToolParamsRaw{Name: "send_email", Arguments: json.RawMessage(`{"to":"x"}`), Meta: mcp.Meta{idemmcp.MetaKey: "k"}}
					if later {
						p.RequestState = "confirm"
					}
					return &mcp.CallToolRequest{Params: p}
				}
				runs := 0
				panicking := func(context.Context, string, mcp.Request) (mcp.Result, error) {
					runs++
					panic("boom")
				}
				var recovered any
				func() {
					defer func() { recovered = recover() }()
					_, _ = mw(panicking)(context.Background(), "tools/call", req())
				}()
				if pe, ok := recovered.(*idemmcp.PanicError); ok && !later {
					// Recovered to store the failure, raised again with
					// the tool's stack (TestGuardToolPanicGoesOnWithTheToolsStack).
					recovered = pe.Value
				}
				assert.Equal(t, "boom", recovered, "the tool's panic goes on out of the Guard")
				answering := func(context.Context, string, mcp.Request) (mcp.Result, error) {
					runs++
					return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sent"}}}, nil
				}
				res, err := mw(answering)(context.Background(), "tools/call", req())
				if later {
					require.NoError(t, err, "the later round's key was released")
					assert.Equal(t, "sent", res.(*mcp.CallToolResult).Content[0].(*mcp.TextContent).Text)
					assert.Equal(t, 2, runs)
					return
				}
				var we *jsonrpc.Error
				require.ErrorAs(t, err, &we, "the first round's failure is kept")
				assert.EqualValues(t, jsonrpc.CodeInternalError, we.Code)
				assert.Equal(t, 1, runs, "the tool did not run again for the key")
			})
		}
	}
}
