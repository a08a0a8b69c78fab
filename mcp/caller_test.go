package mcp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	idemmcp "github.com/idemkit/idem/mcp"
)

// dropFirstAnswers serves h, but for the first n tools/call requests it
// lets the server run the call and then cuts the connection before the
// answer leaves: the answer is lost after the tool ran.
func dropFirstAnswers(h http.Handler, n int64) http.Handler {
	var dropped atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && dropped.Load() < n {
			body, _ := readAndRestore(r)
			if strings.Contains(body, `"tools/call"`) && dropped.Add(1) <= n {
				h.ServeHTTP(httptest.NewRecorder(), r)
				panic(http.ErrAbortHandler)
			}
		}
		h.ServeHTTP(w, r)
	})
}

func openCaller(t *testing.T, j idem.Journal, url string) *idemmcp.Caller {
	t.Helper()
	c, err := idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "mail", Scope: "mcp",
		Open: func(ctx context.Context) (*mcp.ClientSession, error) {
			c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
			return c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil)
		},
		Client: idem.Config{Retry: idem.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func openSQLite(t *testing.T) *idem.SQLiteJournal {
	t.Helper()
	j, err := idem.OpenSQLite(filepath.Join(t.TempDir(), "calls.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	return j
}

func serveMail(t *testing.T, m *mailServer, g *idemmcp.Guard, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	s := m.server(t, g)
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestCallerJournalsBeforeSendingAndAnswersFromTheJournal(t *testing.T) {
	j := openSQLite(t)
	m := &mailServer{}
	var seen atomic.Value
	m.onRun = func() {
		rec, err := j.Lookup(context.Background(), "mcp", "call_abc")
		if err == nil {
			seen.Store(rec)
		}
	}
	c := openCaller(t, j, serveMail(t, m, newGuard(t, idemmcp.GuardConfig{}), nil))
	res, err := c.Call(context.Background(), "call_abc", "send_email", emailIn{To: "ann@example.com", Subject: "hi"})
	require.NoError(t, err)
	assert.Equal(t, "msg-1", structured(t, res).MessageID)
	rec, ok := seen.Load().(idem.Record)
	require.True(t, ok, "the call was journaled before the tool ran")
	assert.Equal(t, idem.StateInFlight, rec.State)
	assert.Equal(t, "http://mail.mcp.invalid/tools/send_email", rec.URL)
	assert.JSONEq(t, `{"subject":"hi","to":"ann@example.com"}`, string(rec.Body))

	again, err := c.Call(context.Background(), "call_abc", "send_email", emailIn{To: "ann@example.com", Subject: "hi"})
	require.NoError(t, err)
	assert.Equal(t, "msg-1", structured(t, again).MessageID)
	assert.EqualValues(t, 1, m.runs.Load())

	_, err = c.Call(context.Background(), "call_abc", "send_email", emailIn{To: "bob@example.com"})
	assert.ErrorIs(t, err, idem.ErrFingerprintMismatch, "one tool-call ID is one call")
}

func TestCallerSettlesALostAnswerWithTheSameKey(t *testing.T) {
	j := openSQLite(t)
	m := &mailServer{}
	url := serveMail(t, m, newGuard(t, idemmcp.GuardConfig{}), func(h http.Handler) http.Handler { return dropFirstAnswers(h, 1) })
	c := openCaller(t, j, url)
	res, err := c.Call(context.Background(), "call_lost", "send_email", emailIn{To: "ann@example.com"})
	require.NoError(t, err)
	assert.Equal(t, "msg-1", structured(t, res).MessageID, "the first run's answer, replayed")
	assert.EqualValues(t, 1, m.runs.Load(), "the tool ran once")
	rec, err := j.Lookup(context.Background(), "mcp", "call_lost")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
	assert.GreaterOrEqual(t, rec.Attempts, 2, "sent again after the lost answer")
}

// The control: the same lost answer against a server without a Guard
// runs the tool twice (the server does not honour keys), which is what
// the test above would see if the key did nothing.
func TestCallerWithoutGuardRunsALostCallTwice(t *testing.T) {
	j := openSQLite(t)
	m := &mailServer{}
	url := serveMail(t, m, nil, func(h http.Handler) http.Handler { return dropFirstAnswers(h, 1) })
	c := openCaller(t, j, url)
	_, err := c.Call(context.Background(), "call_lost", "send_email", emailIn{To: "ann@example.com"})
	require.NoError(t, err)
	assert.EqualValues(t, 2, m.runs.Load())
}

func TestCallerBadInput(t *testing.T) {
	j := openSQLite(t)
	_, err := idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "a b", Open: func(context.Context) (*mcp.ClientSession, error) { return nil, nil }})
	assert.ErrorContains(t, err, "letters, digits and hyphens")
	_, err = idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "mail"})
	assert.ErrorContains(t, err, "Open is nil")
	var opened atomic.Int64
	c, err := idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "mail", Scope: "mcp", Open: func(context.Context) (*mcp.ClientSession, error) {
		opened.Add(1)
		return nil, assert.AnError
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Call(context.Background(), "call_1", "send_email", func() {})
	assert.ErrorIs(t, err, idem.ErrInvalidOp)
	_, err = c.Call(context.Background(), "", "send_email", emailIn{})
	assert.ErrorIs(t, err, idem.ErrInvalidOp)
	_, err = c.Call(context.Background(), "call_2", "", emailIn{})
	assert.ErrorIs(t, err, idem.ErrInvalidOp)
	assert.Zero(t, opened.Load(), "nothing was sent")
}

func TestCallerVerifyTellsAServerThatDoesNotHonourKeys(t *testing.T) {
	j := openSQLite(t)
	guarded := &mailServer{}
	c := openCaller(t, j, serveMail(t, guarded, newGuard(t, idemmcp.GuardConfig{}), nil))
	require.NoError(t, c.Verify(context.Background(), "send_email", emailIn{To: "test@example.com"}))
	assert.EqualValues(t, 1, guarded.runs.Load())

	bare := &mailServer{}
	c = openCaller(t, j, serveMail(t, bare, nil, nil))
	err := c.Verify(context.Background(), "send_email", emailIn{To: "test@example.com"})
	assert.ErrorIs(t, err, idemmcp.ErrKeysNotHonoured)
	assert.EqualValues(t, 2, bare.runs.Load())
}
