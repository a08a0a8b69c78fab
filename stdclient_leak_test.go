package idem_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// Through the standard client, a call's credentials in every spelling an
// SDK may use (a canonical header, a lower-case one set in the map, a
// Config.SecretHeaders one, a cookie) and a token Authorize puts in the
// query reach the server on every send, over a lost answer, a retry and a
// redirect within the origin, and nothing else: not the journal's files,
// the logs, the hooks or the error.
func TestStandardClientCredentialsReachOnlyTheServer(t *testing.T) {
	t.Parallel()
	secrets := map[string]string{
		"Authorization":       "Bearer auth-secret-1",
		"proxy-authorization": "Basic proxy-secret-2",
		"cookie":              "session=cookie-secret-3",
		"x-api-key":           "apikey-secret-4",
	}
	const query = "query-secret-5"
	var mu sync.Mutex
	var missing []string
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		for name, v := range secrets {
			if r.Header.Get(name) != v {
				missing = append(missing, fmt.Sprintf("send %d: %s", n, name))
			}
		}
		if r.URL.Query().Get("sig") != query {
			missing = append(missing, fmt.Sprintf("send %d: the query token", n))
		}
		mu.Unlock()
		switch n {
		case 1:
			// The answer is lost: unknown, retried. Cut, not held past a
			// short AttemptTimeout, which would also bound the re-sends
			// and a loaded machine can make them outlast it.
			dropConn(w)
		case 2:
			w.Header().Set("Location", "/orders/v2")
			w.WriteHeader(http.StatusTemporaryRedirect)
		default:
			w.Header().Set("X-Api-Key", "apikey-secret-4")
			w.Header().Set("Set-Cookie", "session=cookie-secret-3")
			w.WriteHeader(http.StatusCreated)
		}
	})
	dir := t.TempDir()
	j := openJournal(t, filepath.Join(dir, "ops.db"))
	var logs bytes.Buffer
	var seen strings.Builder
	var seenMu sync.Mutex
	note := func(v any) { seenMu.Lock(); fmt.Fprintf(&seen, "%+v\n", v); seenMu.Unlock() }
	c, _ := newClient(t, idem.Config{
		Journal: j, BaseURL: srv.URL, Retry: fastRetry(),
		SecretHeaders: []string{"X-Api-Key"},
		Logger:        slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Hooks: idem.Hooks{
			CallStart:   func(ctx context.Context, call idem.Call) context.Context { note(call); return ctx },
			CallEnd:     func(_ context.Context, call idem.Call, end idem.CallEnd) { note(call); note(end) },
			Attempt:     func(_ context.Context, a idem.AttemptInfo) { note(a) },
			StatusCheck: func(_ context.Context, s idem.StatusCheckInfo) { note(s) },
		},
		Authorize: func(r *http.Request) error {
			q := r.URL.Query()
			q.Set("sig", query)
			r.URL.RawQuery = q.Encode()
			return nil
		},
	})
	ctx := idem.WithOperation(context.Background(), "order-1")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
	require.NoError(t, err)
	for name, v := range secrets {
		req.Header[name] = []string{v} // as set in the map, not canonicalized
	}
	resp, err := c.StandardClient().Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	mu.Lock()
	assert.Empty(t, missing, "every send carries every credential")
	mu.Unlock()
	assert.Len(t, srv.received(), 3)

	require.NoError(t, c.Close())
	require.NoError(t, j.Close())
	stored := journalBytes(t, dir)
	var respHeaders strings.Builder
	_ = resp.Header.Write(&respHeaders)
	for _, v := range append([]string{query}, "auth-secret-1", "proxy-secret-2", "cookie-secret-3", "apikey-secret-4") {
		assert.False(t, bytes.Contains(stored, []byte(v)), "%s reached the journal's files", v)
		assert.NotContains(t, logs.String(), v, "%s reached the logs", v)
		assert.NotContains(t, seen.String(), v, "%s reached the hooks", v)
		assert.NotContains(t, respHeaders.String(), v, "%s came back from the journal", v)
	}
}
