package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
)

// requestKeyServer keeps keys, but only under X-Request-Key, sent as an
// RFC 8941 sf-string; it knows nothing of Idempotency-Key, so a request
// without its header is a new request, run again. The first request ever
// is applied, then answered too late: the client gives up first. The
// status endpoint, GET /status/{key}, reads the key from X-Request-Key
// too.
type requestKeyServer struct {
	*httptest.Server
	mu       sync.Mutex
	executed int               // times the handler ran
	stored   map[string][]byte // answers by key
	seen     []http.Header     // headers of every request
}

func newRequestKeyServer(t *testing.T) *requestKeyServer {
	s := &requestKeyServer{stored: map[string][]byte{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// key reads X-Request-Key: "" when the header is missing or not quoted.
func requestKey(h http.Header) string {
	v := h.Get("X-Request-Key")
	if !strings.HasPrefix(v, `"`) {
		return ""
	}
	key, err := wire.ParseKey(v)
	if err != nil {
		return ""
	}
	return key
}

func (s *requestKeyServer) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := requestKey(r.Header)
	s.mu.Lock()
	s.seen = append(s.seen, r.Header.Clone())
	first := len(s.seen) == 1
	if r.Method == http.MethodGet {
		answer, found := s.stored[key]
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		st := wire.Status{Key: key, State: wire.StateNotFound}
		if found && r.URL.Path == "/status/"+key {
			st = wire.Status{Key: key, State: wire.StateCompleted, Response: wire.NewResponse(http.StatusCreated, nil, answer)}
		} else {
			w.WriteHeader(http.StatusNotFound)
		}
		_ = json.NewEncoder(w).Encode(st)
		return
	}
	if answer, found := s.stored[key]; found && key != "" {
		s.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(answer)
		return
	}
	s.executed++
	answer := append([]byte(`{"order":"o-1","request":`), append(body, '}')...)
	if key != "" {
		s.stored[key] = answer
	}
	s.mu.Unlock()
	if first {
		<-r.Context().Done() // applied, answered too late
		return
	}
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(answer)
}

// unknownUnderRequestKey journals, through an application's client whose
// key goes in X-Request-Key as an sf-string, an order whose outcome is
// unknown: the server applied it and answered after the client gave up,
// and the client's status check could not reach the status endpoint.
func unknownUnderRequestKey(t *testing.T, srv *requestKeyServer) (string, idem.Record) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := "http://" + l.Addr().String()
	require.NoError(t, l.Close())

	path, j := openTestJournal(t)
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, KeyHeader: "X-Request-Key", QuoteKey: true,
		AttemptTimeout: 50 * time.Millisecond, Status: idem.StatusEndpoint(down + "/status"),
		Retry: idem.RetryPolicy{MaxStatusChecks: 1, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond}})
	require.NoError(t, err)
	_, err = c.Do(context.Background(), idem.Op{ID: "checkout/cart-7", Method: "POST", URL: "/orders", Body: []byte(`{"cart":7}`)})
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.NoError(t, c.Close())
	rec, err := j.Lookup(context.Background(), "default", "checkout/cart-7")
	require.NoError(t, err)
	require.NoError(t, j.Close())
	require.Equal(t, idem.StateUnknown, rec.State)
	require.Equal(t, "X-Request-Key", rec.KeyHeader)
	require.True(t, rec.KeyQuoted)
	return path, rec
}

// idem resume sends an operation's key in the form the application
// journaled with it, not in its own: the request and the status check
// carry X-Request-Key: "<key>", never Idempotency-Key, and the handler
// runs once.
func TestResumeUsesTheJournaledKeyForm(t *testing.T) {
	t.Parallel()
	for name, flags := range map[string]func(*requestKeyServer) []string{
		"replay":          func(*requestKeyServer) []string { return []string{"--replay"} },
		"status endpoint": func(s *requestKeyServer) []string { return []string{"--status-url", s.URL + "/status"} },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := newRequestKeyServer(t)
			path, rec := unknownUnderRequestKey(t, srv)

			r := idemOn(t, path, "show", rec.Key)
			requireOK(t, r)
			assert.Contains(t, r.stdout, "key header    X-Request-Key: \""+rec.Key+"\" (quoted: an RFC 8941 sf-string)\n")
			r = idemOn(t, path, "show", rec.Key, "--json")
			requireOK(t, r)
			var got jsonRecord
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
			assert.Equal(t, &jsonKeyForm{Journaled: true, Header: "X-Request-Key", Quoted: true, Value: `"` + rec.Key + `"`}, got.KeyForm)

			srv.mu.Lock()
			before := len(srv.seen)
			srv.mu.Unlock()
			r = cli(t, "", nil, append([]string{"--journal", path, "resume", "--base-url", srv.URL}, flags(srv)...)...)
			require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			assert.Equal(t, map[string]int{"claimed": 1, "succeeded": 1}, nonZero(summary(t, r.stdout)))

			settled := getRecord(t, path, rec.Key)
			assert.Equal(t, idem.StateSucceeded, settled.State)
			require.NotNil(t, settled.Response)
			assert.True(t, settled.Response.Replayed)
			assert.Equal(t, `{"order":"o-1","request":{"cart":7}}`, string(settled.Response.Body))

			srv.mu.Lock()
			defer srv.mu.Unlock()
			assert.Equal(t, 1, srv.executed, "the handler ran once")
			require.Greater(t, len(srv.seen), before, "idem resume asked the server")
			for _, h := range srv.seen[before:] {
				assert.Equal(t, []string{`"` + rec.Key + `"`}, h.Values("X-Request-Key"))
				assert.Empty(t, h.Values("Idempotency-Key"))
			}
		})
	}
}

// The header that carries an operation's key cannot be set from the
// environment: nothing is sent, nothing changes.
func TestResumeRefusesToSetTheKeyHeader(t *testing.T) {
	t.Parallel()
	srv := newRequestKeyServer(t)
	path, _ := unknownUnderRequestKey(t, srv)
	srv.mu.Lock()
	before := len(srv.seen)
	srv.mu.Unlock()
	snap := takeSnapshot(t, path)

	r := cli(t, "", []string{"IDEM_TEST_KEY=forged"}, "--journal", path, "resume", "--base-url", srv.URL, "--replay",
		"--header-env", "x-request-key=IDEM_TEST_KEY")
	requireOneLineError(t, r, 2, "--header-env X-Request-Key=IDEM_TEST_KEY: X-Request-Key carries the idempotency key of operations to resume")
	assert.Equal(t, snap, takeSnapshot(t, path))
	srv.mu.Lock()
	assert.Len(t, srv.seen, before, "nothing was sent")
	srv.mu.Unlock()
}

// An operation journaled before the key's form was (schema 1) is sent in
// the form --legacy-key-header and --legacy-quote-key give: the one the
// application used then.
func TestResumeSendsUnjournaledFormsAsTold(t *testing.T) {
	t.Parallel()
	srv := newRequestKeyServer(t)
	path, rec := unknownUnderRequestKey(t, srv)
	forgetForm(t, path)
	require.Empty(t, getRecord(t, path, rec.Key).KeyHeader, "the record reads as one of schema 1")
	r := idemOn(t, path, "show", rec.Key)
	requireOK(t, r)
	assert.Contains(t, r.stdout, "not journaled")

	r = cli(t, "", nil, "--journal", path, "resume", "--base-url", srv.URL, "--replay", "--legacy-key-header", "nonsense header")
	require.Equal(t, 2, r.code, "a bad header name is a usage error")

	srv.mu.Lock()
	before := len(srv.seen)
	srv.mu.Unlock()
	r = cli(t, "", nil, "--journal", path, "resume", "--base-url", srv.URL, "--replay",
		"--legacy-key-header", "x-request-key", "--legacy-quote-key")
	require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	assert.Equal(t, idem.StateSucceeded, getRecord(t, path, rec.Key).State)
	srv.mu.Lock()
	defer srv.mu.Unlock()
	assert.Equal(t, 1, srv.executed, "the handler ran once")
	require.Greater(t, len(srv.seen), before)
	for _, h := range srv.seen[before:] {
		assert.Equal(t, []string{`"` + rec.Key + `"`}, h.Values("X-Request-Key"))
		assert.Empty(t, h.Values("Idempotency-Key"))
	}
}

// forgetForm makes every record of the journal at path read as one written
// by schema 1, which did not journal the key's form.
func forgetForm(t *testing.T, path string) {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?_busy_timeout=5000")
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`UPDATE operations SET form = 2`)
	require.NoError(t, err)
}
