package idem_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestRedirectLocationTokenIsNotInTheReason: a redirect's Location may
// carry a token in its query as an Op.URL may (a signed URL). When
// net/http cannot parse it, its error quotes the whole Location inside
// the *url.Error's Err ("failed to parse Location header \"…?sig=…\""),
// which redactError leaves as it is: it only rewrites the *url.Error's
// URL. The token then reaches the error Do returns, the logs, and the
// journal's LastError.
func TestRedirectLocationTokenIsNotInTheReason(t *testing.T) {
	t.Parallel()
	const token = "sig_5e4d3c2b1a0f9e8d"
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		// A same-origin 307 whose Location does not parse (a bad escape
		// in its path), its query a token.
		w.Header().Set("Location", "/orders/%zz?sig="+token)
		w.WriteHeader(http.StatusTemporaryRedirect)
	})
	var logs bytes.Buffer
	c, _ := newClient(t, idem.Config{
		BaseURL: srv.URL,
		Retry:   fastRetry(),
		Logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	_, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders", Body: []byte(`{"n":1}`)})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), token, "the error Do returns")
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		assert.NotContains(t, line, token, "a log line")
	}
	rec, lerr := c.Lookup(context.Background(), "", "a")
	require.NoError(t, lerr)
	assert.NotContains(t, rec.LastError, token, "the journal's LastError")
}
