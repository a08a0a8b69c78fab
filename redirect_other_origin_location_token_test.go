package idem_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A 307 to another origin is the operation's answer, not followed, and the
// reason Classify gives quotes its Location whole. A Location may carry a
// token in its query (a signed URL) or userinfo as an Op.URL may, and the
// client keeps those out of its reasons: "without its query and userinfo,
// which may carry a token", in the logs, the journal's history and
// LastError, OnTransition, Hooks and the error Do returns.
func TestAnotherOriginsRedirectLocationTokenIsNotInTheReason(t *testing.T) {
	t.Parallel()
	const token = "sig_other_origin_9a8b7c"
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "https://uploader:"+token+"@storage.example.test/put?X-Sig="+token)
		w.WriteHeader(http.StatusTemporaryRedirect)
	})
	var logs lockedBuffer
	var mu sync.Mutex
	var reasons []string
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(),
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnTransition: func(tr idem.Transition) {
			mu.Lock()
			reasons = append(reasons, tr.Reason, tr.Detail)
			mu.Unlock()
		}})
	ctx := context.Background()
	_, err := c.Do(ctx, idem.Op{ID: "a", URL: "/orders", Body: []byte(`{"n":1}`)})
	require.ErrorIs(t, err, idem.ErrRejected)
	assert.NotContains(t, err.Error(), token, "the error Do returns")
	assert.NotContains(t, logs.String(), token, "the logs")
	rec, err := c.Lookup(ctx, "", "a")
	require.NoError(t, err)
	assert.NotContains(t, rec.LastError, token, "the journal's LastError")
	h, err := j.History(ctx, rec.Key)
	require.NoError(t, err)
	for _, e := range h {
		assert.NotContains(t, e.Detail, token, "a history event")
	}
	mu.Lock()
	assert.NotContains(t, strings.Join(reasons, "\n"), token, "OnTransition")
	mu.Unlock()
}
