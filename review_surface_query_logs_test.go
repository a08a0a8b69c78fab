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
