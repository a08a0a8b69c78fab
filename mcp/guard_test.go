package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
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

type emailIn struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

type emailOut struct {
	MessageID string `json:"message_id"`
}

// mailServer is an MCP server with a send_email tool that counts its
// runs, behind a Guard on store; release, when set, holds each run until
// it is closed.
type mailServer struct {
	runs    atomic.Int64
	release chan struct{}
	started chan struct{}
	onRun   func()
}

func (m *mailServer) server(t *testing.T, guard *idemmcp.Guard) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "send_email"}, func(ctx context.Context, _ *mcp.CallToolRequest, in emailIn) (*mcp.CallToolResult, emailOut, error) {
		n := m.runs.Add(1)
		if m.onRun != nil {
			m.onRun()
		}
		if m.started != nil {
			m.started <- struct{}{}
		}
		if m.release != nil {
			<-m.release
		}
		if in.To == "nobody" {
			return nil, emailOut{}, errors.New("no such mailbox")
		}
		return nil, emailOut{MessageID: "msg-" + string(rune('0'+n))}, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "ping"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, struct{}, error) {
		m.runs.Add(1)
		return nil, struct{}{}, nil
	})
	if guard != nil {
		s.AddReceivingMiddleware(guard.Middleware)
	}
	return s
}

func newGuard(t *testing.T, cfg idemmcp.GuardConfig) *idemmcp.Guard {
	t.Helper()
	if cfg.Store == nil {
		cfg.Store = server.NewMemoryStore()
	}
	if cfg.Tools == nil {
		cfg.Tools = []string{"send_email"}
	}
	if cfg.Scope == nil {
		cfg.Scope = func(context.Context, *mcp.CallToolRequest) string { return "agent-1" }
	}
	g, err := idemmcp.NewGuard(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close() })
	return g
}

// connectHTTP serves s over streamable HTTP and connects a go-sdk client.
func connectHTTP(t *testing.T, s *mcp.Server) *mcp.ClientSession {
	t.Helper()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: srv.URL}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func call(cs *mcp.ClientSession, key string, args any) (*mcp.CallToolResult, error) {
	p := &mcp.CallToolParams{Name: "send_email", Arguments: args}
	if key != "" {
		p.Meta = mcp.Meta{idemmcp.MetaKey: key}
	}
	return cs.CallTool(context.Background(), p)
}

func structured(t *testing.T, res *mcp.CallToolResult) emailOut {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	require.NoError(t, err)
	var out emailOut
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

func TestGuardRunsAToolOncePerKey(t *testing.T) {
	m := &mailServer{}
	cs := connectHTTP(t, m.server(t, newGuard(t, idemmcp.GuardConfig{})))

	first, err := call(cs, "call_1", emailIn{To: "ann@example.com", Subject: "hi"})
	require.NoError(t, err)
	assert.Equal(t, "msg-1", structured(t, first).MessageID)
	assert.Nil(t, first.Meta[idemmcp.MetaReplayed], "a first run is not a replay")

	// The same key and arguments, members in another order: a replay.
	again, err := call(cs, "call_1", map[string]any{"subject": "hi", "to": "ann@example.com"})
	require.NoError(t, err)
	assert.Equal(t, "msg-1", structured(t, again).MessageID)
	assert.Equal(t, true, again.Meta[idemmcp.MetaReplayed])
	assert.EqualValues(t, 1, m.runs.Load(), "the tool ran once for the key")

	// Another key runs again; no key runs as without the Guard.
	_, err = call(cs, "call_2", emailIn{To: "ann@example.com", Subject: "hi"})
	require.NoError(t, err)
	_, err = call(cs, "", emailIn{To: "ann@example.com", Subject: "hi"})
	require.NoError(t, err)
	assert.EqualValues(t, 3, m.runs.Load())
}

func TestGuardReplaysAnErrorResult(t *testing.T) {
	m := &mailServer{}
	cs := connectHTTP(t, m.server(t, newGuard(t, idemmcp.GuardConfig{})))
	for range 2 {
		res, err := call(cs, "call_err", emailIn{To: "nobody"})
		require.NoError(t, err)
		assert.True(t, res.IsError, "the tool's error result is the call's result, replayed as it was")
	}
	assert.EqualValues(t, 1, m.runs.Load())
}

func TestGuardRefusesAKeyReusedWithOtherArguments(t *testing.T) {
	m := &mailServer{}
	cs := connectHTTP(t, m.server(t, newGuard(t, idemmcp.GuardConfig{})))
	_, err := call(cs, "call_1", emailIn{To: "ann@example.com"})
	require.NoError(t, err)
	_, err = call(cs, "call_1", emailIn{To: "bob@example.com"})
	var we *jsonrpc.Error
	require.ErrorAs(t, err, &we)
	assert.EqualValues(t, idemmcp.CodeKeyReused, we.Code)
	assert.Contains(t, we.Message, "other arguments")
	assert.EqualValues(t, 1, m.runs.Load())
}

func TestGuardBadKeysAndMissingKeys(t *testing.T) {
	m := &mailServer{}
	cs := connectHTTP(t, m.server(t, newGuard(t, idemmcp.GuardConfig{RequireKey: true})))
	for name, key := range map[string]any{"number": 42, "empty": "", "control": "a\x00b", "non-ASCII": "caf\u00e9", "long": string(make([]byte, 300))} {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_email", Arguments: emailIn{To: "a"}, Meta: mcp.Meta{idemmcp.MetaKey: key}})
		var we *jsonrpc.Error
		require.ErrorAs(t, err, &we, name)
		assert.EqualValues(t, idemmcp.CodeKeyInvalid, we.Code, name)
	}
	_, err := call(cs, "", emailIn{To: "a"})
	var we *jsonrpc.Error
	require.ErrorAs(t, err, &we)
	assert.EqualValues(t, idemmcp.CodeKeyRequired, we.Code)
	assert.Contains(t, we.Message, idemmcp.MetaKey)
	assert.Zero(t, m.runs.Load(), "nothing ran")
}

func TestGuardNeedsACaller(t *testing.T) {
	m := &mailServer{}
	g, err := idemmcp.NewGuard(idemmcp.GuardConfig{Store: server.NewMemoryStore(), Tools: []string{"send_email"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close() })
	cs := connectHTTP(t, m.server(t, g))
	_, err = call(cs, "call_1", emailIn{To: "a"})
	var we *jsonrpc.Error
	require.ErrorAs(t, err, &we)
	assert.EqualValues(t, idemmcp.CodeNoCaller, we.Code)
	assert.Zero(t, m.runs.Load())
}

func TestGuardKeysArePerCaller(t *testing.T) {
	m := &mailServer{}
	var who atomic.Value
	who.Store("alice")
	cs := connectHTTP(t, m.server(t, newGuard(t, idemmcp.GuardConfig{
		Scope: func(context.Context, *mcp.CallToolRequest) string { return who.Load().(string) }})))
	a, err := call(cs, "call_1", emailIn{To: "x"})
	require.NoError(t, err)
	who.Store("bob")
	b, err := call(cs, "call_1", emailIn{To: "x"})
	require.NoError(t, err)
	assert.NotEqual(t, structured(t, a).MessageID, structured(t, b).MessageID, "bob's key is not alice's")
	assert.EqualValues(t, 2, m.runs.Load())
}

func TestGuardConcurrentDuplicateWaitsOrIsTold(t *testing.T) {
	for _, wait := range []time.Duration{10 * time.Second, -1} {
		m := &mailServer{release: make(chan struct{}), started: make(chan struct{}, 2)}
		cs := connectHTTP(t, m.server(t, newGuard(t, idemmcp.GuardConfig{Wait: wait})))
		var wg sync.WaitGroup
		wg.Add(1)
		var first *mcp.CallToolResult
		go func() {
			defer wg.Done()
			var err error
			first, err = call(cs, "call_1", emailIn{To: "x"})
			assert.NoError(t, err)
		}()
		<-m.started
		if wait < 0 {
			_, err := call(cs, "call_1", emailIn{To: "x"})
			var we *jsonrpc.Error
			require.ErrorAs(t, err, &we)
			assert.EqualValues(t, idemmcp.CodeInProgress, we.Code)
			assert.Contains(t, string(we.Data), "retryAfterMs")
			close(m.release)
			wg.Wait()
		} else {
			done := make(chan *mcp.CallToolResult)
			go func() {
				res, err := call(cs, "call_1", emailIn{To: "x"})
				assert.NoError(t, err)
				done <- res
			}()
			close(m.release)
			second := <-done
			wg.Wait()
			assert.Equal(t, structured(t, first).MessageID, structured(t, second).MessageID, "the duplicate waited for the first call's result")
		}
		assert.EqualValues(t, 1, m.runs.Load())
	}
}

func TestGuardPassesOtherToolsThrough(t *testing.T) {
	m := &mailServer{}
	cs := connectHTTP(t, m.server(t, newGuard(t, idemmcp.GuardConfig{RequireKey: true})))
	for range 2 {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ping", Meta: mcp.Meta{idemmcp.MetaKey: "k"}})
		require.NoError(t, err)
	}
	assert.EqualValues(t, 2, m.runs.Load(), "an unguarded tool runs on every call, key or not")
}

func TestCanonical(t *testing.T) {
	for in, want := range map[string]string{
		``:                          `null`,
		`{"b":1, "a":[true, null]}`: `{"a":[true,null],"b":1}`,
		`1.0`:                       `1.0`,
		`{"x":"<&>"}`:               `{"x":"<&>"}`,
		`{"a":{"d":1,"c":2}}`:       `{"a":{"c":2,"d":1}}`,
	} {
		got, err := idemmcp.Canonical(json.RawMessage(in))
		require.NoError(t, err, in)
		assert.Equal(t, want, string(got), in)
	}
	for _, bad := range []string{`{`, `1 2`, `nul`} {
		_, err := idemmcp.Canonical(json.RawMessage(bad))
		assert.Error(t, err, bad)
	}
}

// The control: without the Guard, the same key runs the tool twice, which
// is what the tests above would see if the Guard did nothing.
func TestWithoutGuardARepeatedKeyRunsTwice(t *testing.T) {
	m := &mailServer{}
	cs := connectHTTP(t, m.server(t, nil))
	for range 2 {
		_, err := call(cs, "call_1", emailIn{To: "x"})
		require.NoError(t, err)
	}
	assert.EqualValues(t, 2, m.runs.Load())
}

// readAndRestore reads r's body and puts it back for the next reader.
func readAndRestore(r *http.Request) (string, error) {
	b, err := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(b))
	return string(b), err
}

// A negative MaxArgumentBytes has no meaning: NewGuard refuses it, naming
// the field, instead of a Guard that refuses every guarded call as too
// large.
func TestNewGuardRefusesANegativeArgumentLimit(t *testing.T) {
	t.Parallel()
	g, err := idemmcp.NewGuard(idemmcp.GuardConfig{Store: server.NewMemoryStore(), Tools: []string{"send_email"}, MaxArgumentBytes: -1})
	require.Error(t, err)
	require.Nil(t, g)
	assert.Contains(t, err.Error(), "GuardConfig.MaxArgumentBytes is negative (-1)")
}
