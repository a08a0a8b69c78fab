package mcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	idemmcp "github.com/idemkit/idem/mcp"
)

// countToolCalls counts the tools/call requests that reach h.
func countToolCalls(n *atomic.Int64) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				if body, _ := readAndRestore(r); strings.Contains(body, `"tools/call"`) {
					n.Add(1)
				}
			}
			h.ServeHTTP(w, r)
		})
	}
}

// A JSON-RPC error the server answered (go-sdk hands it to the client
// wrapped: "calling "tools/call": ...") is the server's answer: the call is
// settled as rejected, once, and a repeated Call answers it from the
// journal without sending.
func TestCallerSettlesAServersJSONRPCErrorOnce(t *testing.T) {
	j := openSQLite(t)
	m := &mailServer{}
	var sent atomic.Int64
	c := openCaller(t, j, serveMail(t, m, newGuard(t, idemmcp.GuardConfig{}), countToolCalls(&sent)))
	for i := range 2 {
		_, err := c.Call(context.Background(), "call_unknown", "no_such_tool", emailIn{To: "ann@example.com"})
		var we *jsonrpc.Error
		require.ErrorAs(t, err, &we, "call %d", i+1)
		assert.EqualValues(t, jsonrpc.CodeInvalidParams, we.Code)
		assert.Contains(t, we.Message, "no_such_tool")
	}
	assert.EqualValues(t, 1, sent.Load(), "the server's answer was final: sent once, then answered from the journal")
	rec, err := j.Lookup(context.Background(), "mcp", "call_unknown")
	require.NoError(t, err)
	assert.True(t, rec.State.Terminal(), "settled, not %s", rec.State)
	_, err = c.Result(context.Background(), "call_unknown")
	var we *jsonrpc.Error
	assert.ErrorAs(t, err, &we)
}

// A guarded tool whose handler fails with a Go error (a JSON-RPC error,
// not an isError result) ran: the error is stored, replayed, and the
// Caller settles the call with it, never running the tool again.
func TestGuardAndCallerKeepAToolsProtocolError(t *testing.T) {
	j := openSQLite(t)
	var runs atomic.Int64
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "charge", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		runs.Add(1)
		return nil, errors.New("the card was charged, then the ledger failed")
	})
	s.AddReceivingMiddleware(newGuard(t, idemmcp.GuardConfig{Tools: []string{"charge"}}).Middleware)
	srv := newHTTPServer(t, s)
	cs := connectURL(t, srv)
	for range 2 {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"n": 1}, Meta: mcp.Meta{idemmcp.MetaKey: "k1"}})
		var we *jsonrpc.Error
		require.ErrorAs(t, err, &we)
		assert.Contains(t, we.Message, "ledger failed")
	}
	assert.EqualValues(t, 1, runs.Load(), "a failed run is stored, not run again")

	c := openCaller(t, j, srv)
	for range 2 {
		_, err := c.Call(context.Background(), "call_charge", "charge", map[string]any{"n": 2})
		var we *jsonrpc.Error
		require.ErrorAs(t, err, &we)
		assert.Contains(t, we.Message, "ledger failed")
	}
	assert.EqualValues(t, 2, runs.Load(), "the Caller's call ran once")
	rec, err := j.Lookup(context.Background(), "mcp", "call_charge")
	require.NoError(t, err)
	assert.True(t, rec.State.Terminal(), "settled by the stored error, not %s", rec.State)
	assert.Equal(t, 1, rec.Attempts, "the answer was the server's: not sent again")
}

func newHTTPServer(t *testing.T, s *mcp.Server) string {
	t.Helper()
	srv := httptestServer(t, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	return srv
}

func connectURL(t *testing.T, url string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

var _ = idem.ErrNotFound
var _ = json.Marshal

// connectGuardedAccepting guards s, serves it over streamable HTTP
// (stateless or not) and connects a client that accepts every request for
// input with what content returns.
func connectGuardedAccepting(t *testing.T, s *mcp.Server, stateless bool, content func() map[string]any) *mcp.ClientSession {
	t.Helper()
	s.AddReceivingMiddleware(newGuard(t, idemmcp.GuardConfig{}).Middleware)
	url := httptestServer(t, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: stateless}))
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: content()}, nil
		}})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func httptestServer(t *testing.T, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// A guarded tool that asks the client for input first (a multi-round-trip
// result, SEP-2322) is not done by its first answer. On a stateful server
// go-sdk fulfils the input inside the call, under the Guard; on a
// stateless one (protocol 2026-07-28) the client does, and calls again
// with the same params, key included, plus the responses: that round runs
// the tool, once, and each round is replayed on its own.
func TestGuardLetsAToolAskForInputFirst(t *testing.T) {
	for _, stateless := range []bool{false, true} {
		var asked, ran atomic.Int64
		s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
		s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if len(req.Params.InputResponses) == 0 {
				asked.Add(1)
				return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"confirm": &mcp.ElicitParams{Message: "send it?",
					RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}}}}}, nil
			}
			ran.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sent"}}}, nil
		})
		cs := connectGuardedAccepting(t, s, stateless, func() map[string]any { return map[string]any{} })
		call := func() (*mcp.CallToolResult, error) {
			return cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_email", Arguments: emailIn{To: "ann@example.com"},
				Meta: mcp.Meta{idemmcp.MetaKey: "call_confirm"}})
		}
		res, err := call()
		require.NoError(t, err, "stateless %v: the round with the input ran the tool", stateless)
		require.False(t, res.NeedsInput())
		assert.Equal(t, "sent", res.Content[0].(*mcp.TextContent).Text)
		assert.EqualValues(t, 1, ran.Load())

		// The whole exchange again, as after a lost answer: replayed.
		res, err = call()
		require.NoError(t, err)
		assert.Equal(t, "sent", res.Content[0].(*mcp.TextContent).Text)
		assert.Equal(t, true, res.Meta[idemmcp.MetaReplayed], "stateless %v", stateless)
		assert.EqualValues(t, 1, ran.Load(), "stateless %v: the tool ran once for the key", stateless)
		assert.EqualValues(t, 1, asked.Load(), "stateless %v: the first round was replayed too", stateless)
	}
}

// liar is a tool that marks its own result as a replay.
func liar(runs *atomic.Int64) mcp.ToolHandler {
	return func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		runs.Add(1)
		return &mcp.CallToolResult{Meta: mcp.Meta{idemmcp.MetaReplayed: true}, Content: []mcp.Content{&mcp.TextContent{Text: "ran"}}}, nil
	}
}

// The replay mark is the Guard's: a tool that sets it on a result it just
// produced does not get it to the client, and a replay carries it.
func TestGuardOwnsTheReplayMark(t *testing.T) {
	var runs atomic.Int64
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, liar(&runs))
	s.AddReceivingMiddleware(newGuard(t, idemmcp.GuardConfig{}).Middleware)
	cs := connectURL(t, newHTTPServer(t, s))
	first, err := call(cs, "k1", map[string]any{})
	require.NoError(t, err)
	assert.Nil(t, first.Meta[idemmcp.MetaReplayed], "a first run is not a replay, whatever the tool says")
	again, err := call(cs, "k1", map[string]any{})
	require.NoError(t, err)
	assert.Equal(t, true, again.Meta[idemmcp.MetaReplayed])
	assert.EqualValues(t, 1, runs.Load())
}

// Verify is not fooled by a server without keys whose tool marks every
// result a replay: the first answer to a new key cannot be one.
func TestVerifyIsNotFooledByAToolThatMarksItsResultsReplayed(t *testing.T) {
	var runs atomic.Int64
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, liar(&runs))
	c := openCaller(t, openSQLite(t), newHTTPServer(t, s))
	err := c.Verify(context.Background(), "send_email", map[string]any{})
	assert.ErrorIs(t, err, idemmcp.ErrKeysNotHonoured)
	assert.EqualValues(t, 2, runs.Load(), "it ran twice: keys are not honoured")
}

// Arguments that read as one value to encoding/json but as two to a tool
// that reads its raw arguments (go-sdk hands them over as sent): a
// repeated member, a lone surrogate, bytes that are not UTF-8. With one
// key, the second must not get the first's result as if it were its own.
func TestGuardDoesNotReplayArgumentsThatOnlyReadTheSame(t *testing.T) {
	for name, pair := range map[string][2]string{
		"repeated member":   {`{"to":"ann","to":"bob"}`, `{"to":"bob"}`},
		"lone surrogates":   {`{"to":"\ud800"}`, `{"to":"\udc00"}`},
		"surrogate or FFFD": {`{"to":"\ud800"}`, `{"to":"\ufffd"}`},
		"not UTF-8":         {"{\"to\":\"\xff\"}", "{\"to\":\"\xfe\"}"},
	} {
		var runs atomic.Int64
		s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
		s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			runs.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(req.Params.Arguments)}}}, nil
		})
		s.AddReceivingMiddleware(newGuard(t, idemmcp.GuardConfig{}).Middleware)
		cs := connectURL(t, newHTTPServer(t, s))
		var answers []string
		for _, args := range pair {
			res, err := call(cs, "k1", json.RawMessage(args))
			if err != nil {
				var we *jsonrpc.Error
				require.ErrorAs(t, err, &we, name)
				answers = append(answers, "refused")
				continue
			}
			answers = append(answers, res.Content[0].(*mcp.TextContent).Text)
			assert.Nil(t, res.Meta[idemmcp.MetaReplayed], "%s: %s got another call's result as its own", name, args)
		}
		assert.NotEqual(t, pair[0], answers[1], name)
	}
}

func TestCanonicalRefusesWhatReadsLossily(t *testing.T) {
	for in, want := range map[string]string{
		`{"s":"\ud83d\ude00"}`:            `{"s":"😀"}`,
		`{"s":"\\ud800"}`:                 `{"s":"\\ud800"}`,
		`[{"a":1},{"a":2}]`:               `[{"a":1},{"a":2}]`,
		`{"a":{"a":1},"b":[{"a":1}]}`:     `{"a":{"a":1},"b":[{"a":1}]}`,
		`{"a":"x","b":["a","a"],"c":"a"}`: `{"a":"x","b":["a","a"],"c":"a"}`,
		`{"a":{"A":1},"b":[{"a":1}]}`:     `{"a":{"A":1},"b":[{"a":1}]}`,
	} {
		got, err := idemmcp.Canonical(json.RawMessage(in))
		require.NoError(t, err, in)
		assert.Equal(t, want, string(got), in)
	}
	for _, bad := range []string{`{"a":1,"a":1}`, `[{"x":{"a":1,"b":2,"a":3}}]`, `"\udc00"`, `"\ud800x"`, `"\ud800\u0041"`, "\"\xc3\"", `{"\ud800":1}`, `{"to":1,"To":2}`, `[{"x":{"id":1,"ID":1}}]`, `{"\u212a":1,"k":2}`, `{"ſ":1,"S":2}`} {
		_, err := idemmcp.Canonical(json.RawMessage(bad))
		assert.ErrorContains(t, err, "ambiguous", bad)
	}
}

// The whole exchange of a tool that asks for input, sent again after its
// answer was lost, with the input answered differently the second time
// (a person asked twice): the tool's work was done by the first exchange,
// and is not done again.
func TestGuardRunsAToolThatAskedForInputOnceWhateverTheAnswers(t *testing.T) {
	var ran atomic.Int64
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if len(req.Params.InputResponses) == 0 {
			return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"confirm": &mcp.ElicitParams{Message: "cc whom?",
				RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"cc": map[string]any{"type": "string"}}}}}}, nil
		}
		ran.Add(1)
		cc := req.Params.InputResponses["confirm"].(*mcp.ElicitResult).Content["cc"]
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprint("sent, cc ", cc)}}}, nil
	})
	var asked atomic.Int64
	cs := connectGuardedAccepting(t, s, true, func() map[string]any { return map[string]any{"cc": fmt.Sprint("person-", asked.Add(1))} })
	var answers []string
	for range 2 {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_email", Arguments: emailIn{To: "ann@example.com"},
			Meta: mcp.Meta{idemmcp.MetaKey: "call_cc"}})
		require.NoError(t, err)
		answers = append(answers, res.Content[0].(*mcp.TextContent).Text)
	}
	assert.EqualValues(t, 2, asked.Load(), "asked again, answered otherwise")
	assert.EqualValues(t, 1, ran.Load(), "the e-mail was sent once for the key")
	assert.Equal(t, []string{"sent, cc person-1", "sent, cc person-1"}, answers)
}

// A tool that asks twice (three rounds) gets through the Guard, once.
func TestGuardToolThatAsksTwice(t *testing.T) {
	var ran atomic.Int64
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	ask := func(id string) *mcp.CallToolResult {
		return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{id: &mcp.ElicitParams{Message: id + "?",
			RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}}}}, RequestState: id}
	}
	s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		switch req.Params.RequestState {
		case "":
			return ask("confirm"), nil
		case "confirm":
			return ask("cc"), nil
		}
		ran.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sent"}}}, nil
	})
	cs := connectGuardedAccepting(t, s, true, func() map[string]any { return map[string]any{} })
	for range 2 {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_email", Arguments: map[string]any{}, Meta: mcp.Meta{idemmcp.MetaKey: "k"}})
		require.NoError(t, err)
		assert.Equal(t, "sent", res.Content[0].(*mcp.TextContent).Text)
	}
	assert.EqualValues(t, 1, ran.Load())
}
