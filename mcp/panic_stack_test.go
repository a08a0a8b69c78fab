package mcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemmcp "github.com/idemkit/idem/mcp"
)

// toolThatPanicsDeepInside panics from a frame of its own, so that the
// re-raised panic can be checked for the tool's stack.
//
//go:noinline
func toolThatPanicsDeepInside(v any) { panic(v) }

// The Guard recovers a first round's panic to store the failure as the
// key's outcome, then raises it again; go-sdk recovers none, so the
// process ends with the stack of the panic it sees. Raised again as the
// bare value, that stack was the Guard's, not the tool's: the operator
// could not tell where the tool failed. The panic goes on as a
// *PanicError that keeps the value and the tool's stack; an error value
// stays reachable with errors.Is/As, and http.ErrAbortHandler, meant to
// abort quietly, goes on as itself.
func TestGuardToolPanicGoesOnWithTheToolsStack(t *testing.T) {
	sentinel := errors.New("the tool's own error")
	for _, tc := range []struct {
		name  string
		value any
	}{{"string", "boom"}, {"error", sentinel}, {"abort", http.ErrAbortHandler}} {
		t.Run(tc.name, func(t *testing.T) {
			mw := newGuard(t, idemmcp.GuardConfig{}).Middleware
			req := &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{Name: "send_email",
				Arguments: json.RawMessage(`{"to":"x"}`), Meta: mcp.Meta{idemmcp.MetaKey: "k-" + tc.name}}}
			var recovered any
			func() {
				defer func() { recovered = recover() }()
				_, _ = mw(func(context.Context, string, mcp.Request) (mcp.Result, error) {
					toolThatPanicsDeepInside(tc.value)
					return nil, nil
				})(context.Background(), "tools/call", req)
			}()
			require.NotNil(t, recovered, "the tool's panic goes on out of the Guard")
			if tc.value == http.ErrAbortHandler {
				assert.Equal(t, http.ErrAbortHandler, recovered, "http.ErrAbortHandler goes on as itself")
				return
			}
			pe, ok := recovered.(*idemmcp.PanicError)
			require.True(t, ok, "the panic goes on as a *PanicError, got %T: %v", recovered, recovered)
			assert.Equal(t, tc.value, pe.Value)
			assert.Contains(t, string(pe.Stack), "toolThatPanicsDeepInside", "the stack is the tool's")
			assert.Contains(t, pe.Error(), "toolThatPanicsDeepInside", "printed, it shows the tool's stack")
			assert.Contains(t, pe.Error(), `"send_email"`, "and names the tool")
			if err, isErr := tc.value.(error); isErr {
				assert.ErrorIs(t, pe, err)
			}
		})
	}
}
