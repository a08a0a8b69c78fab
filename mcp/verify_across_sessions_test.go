package mcp_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemmcp "github.com/idemkit/idem/mcp"
)

// A Caller settles a lost answer by sending the call again, and a lost
// answer is a broken session: the call goes again on a new one. A server
// whose keys do not outlive a session (a Guard scoped by the session, a
// key cache kept per connection) replays within one session and runs the
// call again on the next. Verify sends its two calls on one session, so
// it reports such a server as honouring keys, and the Caller's promise
// then fails on the first lost answer: the tool runs twice.
func TestVerifyTellsAServerWhoseKeysDoNotOutliveASession(t *testing.T) {
	m := &mailServer{}
	g := newGuard(t, idemmcp.GuardConfig{Scope: func(_ context.Context, req *mcp.CallToolRequest) string { return req.Session.ID() }})
	var drop atomic.Bool
	url := serveMail(t, m, g, func(h http.Handler) http.Handler {
		lossy := dropFirstAnswers(h, 1)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if drop.Load() {
				lossy.ServeHTTP(w, r)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	c := openCaller(t, openSQLite(t), url)
	verr := c.Verify(context.Background(), "send_email", emailIn{To: "test@example.com"})
	m.runs.Store(0)

	drop.Store(true)
	_, err := c.Call(context.Background(), "call_lost", "send_email", emailIn{To: "ann@example.com"})
	require.NoError(t, err)
	if m.runs.Load() > 1 {
		assert.ErrorIs(t, verr, idemmcp.ErrKeysNotHonoured,
			"Verify said the server honours keys, and a lost answer then ran the tool %d times", m.runs.Load())
	}
}
