package otel_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// Through the standard client, the credentials an SDK puts on its request
// (Authorization, a Config.SecretHeaders header) travel in the call's
// context object since 660f142: they reach the server, and no span,
// event or metric. A guard: held when written. (An injected
// DropAfterCommit did not lead to a status check through the standard
// client here; not pursued.)
func TestNothingSecretLeavesThroughTheStandardClient(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	srv := tel.startServer(t)
	c, _ := newClient(t, srv, tel.clientHooks(), func(cfg *idem.Config) { cfg.SecretHeaders = []string{"X-Api-Key"} })
	for i := range 2 {
		op := markedOp(i)
		req, err := http.NewRequestWithContext(idem.WithOperation(t.Context(), op.ID), http.MethodPost, srv.URL+op.URL, strings.NewReader(string(op.Body)))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+secretToken)
		req.Header.Set("X-Api-Key", secretHeader)
		resp, err := c.StandardClient().Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
	}
	assert.Contains(t, tel.headerOf("POST /orders", "Authorization"), "Bearer "+secretToken, "the credential was there to leak")
	tel.assertNothingSecret(t, []string{secretToken, secretHeader})
}
