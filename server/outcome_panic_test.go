package server_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

// TestOnOutcomeReportsARequestWhoseHandlerPanicked: OnOutcome "is called
// once for each request with a keyed method", and a handler that panicked
// is the request metrics most need to count: the key ran, and its stored
// outcome is a 500. The middleware reports after serve returns, so a panic
// unwinding through it skips the report: the run is never counted, and only
// its replay is.
func TestOnOutcomeReportsARequestWhoseHandlerPanicked(t *testing.T) {
	t.Parallel()
	var got outcomes
	e := newEnv(t, func(http.ResponseWriter, *http.Request) { panic("boom") }, got.option())

	_, err := e.send(context.Background(), http.MethodPost, "/orders", `{}`, "Idempotency-Key", "k1")
	require.Error(t, err, "the panic aborts the first answer")
	r := e.post("/orders", "k1", `{}`)
	require.Equal(t, http.StatusInternalServerError, r.Status, "the stored panic is replayed")
	assert.Equal(t, server.ProblemHandlerPanicked, r.problem(t).Type)

	assert.Equal(t, server.OutcomeReplayed, got.last(t, 2).Kind, "two keyed requests, two outcomes")
	got.mu.Lock()
	defer got.mu.Unlock()
	assert.Equal(t, server.Outcome{Kind: server.OutcomeRan, Key: "k1", Status: http.StatusInternalServerError}, got.seen[0],
		"the run that panicked is reported")
}
