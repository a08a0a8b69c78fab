package mcp_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	idemmcp "github.com/idemkit/idem/mcp"
	"github.com/idemkit/idem/server"
)

// headerClient sends header on every request.
func headerClient(header http.Header) *http.Client {
	return &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		for k, v := range header {
			r.Header[k] = v
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func connectWith(t *testing.T, url string, hc *http.Client) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// The Idempotency-Key header keys a call on streamable HTTP, stateful or
// stateless; a _meta key that says otherwise is refused.
func TestGuardHeaderKey(t *testing.T) {
	for _, stateless := range []bool{false, true} {
		m := &mailServer{}
		s := m.server(t, newGuard(t, idemmcp.GuardConfig{}))
		url := httptestServer(t, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: stateless}))
		cs := connectWith(t, url, headerClient(http.Header{"Idempotency-Key": {"hdr-1"}}))
		for range 2 {
			_, err := call(cs, "", emailIn{To: "ann@example.com"})
			require.NoError(t, err)
		}
		assert.EqualValues(t, 1, m.runs.Load(), "stateless %v: the header's key", stateless)
		_, err := call(cs, "other", emailIn{To: "ann@example.com"})
		var we *jsonrpc.Error
		require.ErrorAs(t, err, &we)
		assert.EqualValues(t, idemmcp.CodeKeyInvalid, we.Code)
		assert.Contains(t, we.Message, "different keys")
		assert.EqualValues(t, 1, m.runs.Load())
	}
}

// Two users of one server behind bearer authentication, one key: the
// default scope (the token's user) keeps them apart; the token itself is
// in neither the store nor the answer.
func TestGuardScopesByTheAuthenticatedUser(t *testing.T) {
	// No GuardConfig.Scope: the default, the token's user (newGuard would
	// set a constant one).
	g, err := idemmcp.NewGuard(idemmcp.GuardConfig{Store: server.NewMemoryStore(), Tools: []string{"send_email"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close() })
	m := &mailServer{}
	s := m.server(t, g)
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		user, ok := strings.CutPrefix(token, "secret-of-")
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: user, Expiration: time.Now().Add(time.Hour)}, nil
	}
	h := auth.RequireBearerToken(verify, nil)(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	url := httptestServer(t, h)
	alice := connectWith(t, url, headerClient(http.Header{"Authorization": {"Bearer secret-of-alice"}}))
	bob := connectWith(t, url, headerClient(http.Header{"Authorization": {"Bearer secret-of-bob"}}))
	a, err := call(alice, "call_1", emailIn{To: "x"})
	require.NoError(t, err)
	b, err := call(bob, "call_1", emailIn{To: "x"})
	require.NoError(t, err)
	assert.NotEqual(t, structured(t, a).MessageID, structured(t, b).MessageID, "bob's call_1 is not alice's")
	assert.Nil(t, b.Meta[idemmcp.MetaReplayed])
	again, err := call(alice, "call_1", emailIn{To: "x"})
	require.NoError(t, err)
	assert.Equal(t, structured(t, a).MessageID, structured(t, again).MessageID)
	assert.EqualValues(t, 2, m.runs.Load())
}

// A tool that runs longer than LockTimeout keeps its key (the heartbeat):
// a duplicate waits for its result and does not run it again.
func TestGuardToolLongerThanLockTimeout(t *testing.T) {
	store := &renewals{Store: server.NewMemoryStore()}
	m := &mailServer{started: make(chan struct{}, 2)}
	// The tool runs until its lock was renewed four times: past
	// LockTimeout, whatever the machine's load.
	m.onRun = func() {
		for store.n.Load() < 4 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	cs := connectHTTP(t, m.server(t, newGuard(t, idemmcp.GuardConfig{Store: store, LockTimeout: 1500 * time.Millisecond, Retention: time.Hour, Wait: time.Minute})))
	done := make(chan *mcp.CallToolResult, 2)
	for range 2 {
		go func() {
			res, err := call(cs, "slow", emailIn{To: "x"})
			assert.NoError(t, err)
			done <- res
		}()
	}
	a, b := <-done, <-done
	assert.EqualValues(t, 1, m.runs.Load(), "one run for the key")
	assert.Equal(t, structured(t, a).MessageID, structured(t, b).MessageID)
}

// The client gives up on a call mid-run (its context canceled, go-sdk
// sends notifications/cancelled): the tool finishes, its result is stored,
// and the call sent again gets it.
func TestGuardCallCanceledMidRunFinishesAndIsReplayed(t *testing.T) {
	m := &mailServer{release: make(chan struct{}), started: make(chan struct{}, 1)}
	finished := make(chan struct{}, 2)
	g := newGuard(t, idemmcp.GuardConfig{})
	s := m.server(t, g)
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			if method == "tools/call" {
				finished <- struct{}{}
			}
			return res, err
		}
	})
	cs := connectURL(t, newHTTPServer(t, s))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "send_email", Arguments: emailIn{To: "x"}, Meta: mcp.Meta{idemmcp.MetaKey: "gone"}})
		errc <- err
	}()
	<-m.started
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	close(m.release)
	<-finished
	res, err := call(cs, "gone", emailIn{To: "x"})
	require.NoError(t, err)
	assert.Equal(t, true, res.Meta[idemmcp.MetaReplayed])
	assert.EqualValues(t, 1, m.runs.Load())
}

// One key for two tools: the second is refused, saying why.
func TestGuardOneKeyTwoTools(t *testing.T) {
	m := &mailServer{}
	cs := connectHTTP(t, m.server(t, newGuard(t, idemmcp.GuardConfig{Tools: []string{"send_email", "ping"}})))
	_, err := call(cs, "k", emailIn{To: "x"})
	require.NoError(t, err)
	_, err = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ping", Arguments: map[string]any{}, Meta: mcp.Meta{idemmcp.MetaKey: "k"}})
	var we *jsonrpc.Error
	require.ErrorAs(t, err, &we)
	assert.EqualValues(t, idemmcp.CodeKeyReused, we.Code)
	assert.Contains(t, we.Message, "another tool")
	assert.EqualValues(t, 1, m.runs.Load())
}

// A tool that panics (recovered outside the Guard, as a server that
// survives it would): the key's outcome is the failure, and the tool does
// not run again for it.
func TestGuardToolThatPanics(t *testing.T) {
	var runs atomic.Int64
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "send_email", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		runs.Add(1)
		panic("boom")
	})
	s.AddReceivingMiddleware(newGuard(t, idemmcp.GuardConfig{}).Middleware)
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (res mcp.Result, err error) {
			defer func() {
				if p := recover(); p != nil {
					res, err = nil, fmt.Errorf("panic: %v", p)
				}
			}()
			return next(ctx, method, req)
		}
	})
	cs := connectURL(t, newHTTPServer(t, s))
	for range 2 {
		_, err := call(cs, "k", map[string]any{})
		require.Error(t, err)
	}
	assert.EqualValues(t, 1, runs.Load())
}

// Open fails: the call is journaled, nothing ran, the error says so; a
// later Call with a server that answers runs it once.
func TestCallerOpenFails(t *testing.T) {
	j := openSQLite(t)
	m := &mailServer{}
	url := serveMail(t, m, newGuard(t, idemmcp.GuardConfig{}), nil)
	var up atomic.Bool
	c, err := idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "mail", Scope: "mcp",
		Open: func(ctx context.Context) (*mcp.ClientSession, error) {
			if !up.Load() {
				return nil, errors.New("connection refused")
			}
			return mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).
				Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil)
		},
		Client: idem.Config{Retry: idem.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond, MaxAttempts: 3}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Call(context.Background(), "call_down", "send_email", emailIn{To: "x"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "connection refused")
	_, rerr := c.Result(context.Background(), "call_down")
	assert.Error(t, rerr, "not settled")
	up.Store(true)
	res, err := c.Call(context.Background(), "call_down", "send_email", emailIn{To: "x"})
	require.NoError(t, err)
	assert.Equal(t, "msg-1", structured(t, res).MessageID)
	assert.EqualValues(t, 1, m.runs.Load())
}

// The session's credentials (here a bearer token in Open's HTTP client)
// are nowhere in the journal.
func TestCallerJournalHoldsNoCredential(t *testing.T) {
	dir := t.TempDir()
	j, err := idem.OpenSQLite(dir + "/calls.db")
	require.NoError(t, err)
	m := &mailServer{}
	url := serveMail(t, m, newGuard(t, idemmcp.GuardConfig{}), nil)
	c, err := idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "mail", Scope: "mcp",
		Open: func(ctx context.Context) (*mcp.ClientSession, error) {
			return mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx,
				&mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1, HTTPClient: headerClient(http.Header{"Authorization": {"Bearer tok-SEKRIT-42"}})}, nil)
		}})
	require.NoError(t, err)
	_, err = c.Call(context.Background(), "call_1", "send_email", emailIn{To: "x"})
	require.NoError(t, err)
	require.NoError(t, c.Close())
	require.NoError(t, j.Close())
	files := 0
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		files++
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.NotContains(t, string(b), "SEKRIT", path)
		return nil
	}))
	assert.NotZero(t, files)
}

// renewals counts the lock renewals that succeeded.
type renewals struct {
	server.Store
	n atomic.Int64
}

func (s *renewals) Renew(ctx context.Context, scope, key string, token int64, now time.Time) error {
	err := s.Store.Renew(ctx, scope, key, token, now)
	if err == nil {
		s.n.Add(1)
	}
	return err
}
