package idem_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestLogsCarryNoQueryStringToken: Config.Logger promises "no bodies, no
// header values, no secrets", and the project treats a URL's query as a
// place for a token (stdclient's redact drops it from errors: "which may
// carry personal data or a token"; otel records server.address and port,
// never path or query). A lost answer to an operation whose URL carries
// ?api_key=… must not put the key in the log lines, at warn level least
// of all.
func TestLogsCarryNoQueryStringToken(t *testing.T) {
	t.Parallel()
	const token = "qk_live_7d1c2b3a4f5e6d7c"
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		dropConn(w) // every answer is lost: attempt, then status checks by replay
	})
	var logs bytes.Buffer
	c, _ := newClient(t, idem.Config{
		BaseURL: srv.URL,
		Retry:   fastRetry(),
		Logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	_, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders?api_key=" + token})
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.NotEmpty(t, logs.String())
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		assert.False(t, strings.Contains(line, token), "a log line carries the URL's query token: %s", line)
	}
}

// TestErrorsAndHistoryCarryNoQueryStringToken: the transport's error
// reaches more than the logs: the journal's history and LastError (shown
// by the CLI and the UI), OnTransition, and the error Do returns (which the
// application logs). None carries the URL's query; the journaled request
// keeps it, and every attempt and replay sends it.
func TestErrorsAndHistoryCarryNoQueryStringToken(t *testing.T) {
	t.Parallel()
	const token = "qk_live_0f1e2d3c4b5a6978"
	var (
		mu      sync.Mutex
		queries []string
	)
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		queries = append(queries, r.URL.RawQuery)
		mu.Unlock()
		dropConn(w)
	})
	var reasons []string
	c, j := newClient(t, idem.Config{
		BaseURL: srv.URL,
		Retry:   fastRetry(),
		OnTransition: func(tr idem.Transition) {
			mu.Lock()
			reasons = append(reasons, tr.Reason, tr.Detail)
			mu.Unlock()
		},
	})
	_, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders?api_key=" + token})
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	assert.NotContains(t, err.Error(), token)
	var ue *url.Error
	require.ErrorAs(t, err, &ue, "the transport's error is still a *url.Error")
	assert.NotContains(t, ue.URL, "api_key")
	assert.Contains(t, ue.URL, "/orders")
	assert.ErrorIs(t, err, io.EOF, "and still wraps its cause")

	rec, err := c.Lookup(context.Background(), "", "a")
	require.NoError(t, err)
	assert.Contains(t, rec.URL, "api_key="+token, "the journaled request keeps its query: it is sent again")
	assert.NotContains(t, rec.LastError, token)
	events, err := j.History(context.Background(), rec.Key)
	require.NoError(t, err)
	require.NotEmpty(t, events)
	for _, e := range events {
		assert.NotContains(t, e.Detail, token, "history: %+v", e)
	}
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, reasons)
	for _, r := range reasons {
		assert.NotContains(t, r, token)
	}
	require.NotEmpty(t, queries)
	for _, q := range queries {
		assert.Equal(t, "api_key="+token, q, "every attempt and replay sends the query")
	}
}

// TestStatusAdapterURLQueryTokenIsNotInTheReason: a status URL may carry a
// token in its query too (StatusAdapter.URL is the application's); a check
// that fails says which endpoint without it.
func TestStatusAdapterURLQueryTokenIsNotInTheReason(t *testing.T) {
	t.Parallel()
	const token = "st_9a8b7c6d5e4f3a2b"
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		dropConn(w) // the attempt's answer and every status check's are lost
	})
	var logs bytes.Buffer
	c, _ := newClient(t, idem.Config{
		BaseURL: srv.URL,
		Retry:   fastRetry(),
		Logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Status: idem.StatusAdapter{
			Name:   "outcome",
			URL:    srv.URL + "/outcome/{key}?token=" + token,
			Decode: func(int, http.Header, []byte) (idem.Status, error) { return idem.Status{}, errors.New("unreachable") },
		},
	})
	_, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders"})
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	assert.Contains(t, err.Error(), "/outcome/", "the reason names the status URL")
	assert.NotContains(t, err.Error(), token)
	assert.Contains(t, logs.String(), "status check did not settle")
	assert.NotContains(t, logs.String(), token)
}
