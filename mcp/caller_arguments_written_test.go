package mcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	idemmcp "github.com/idemkit/idem/mcp"
)

// The Caller journals and sends the arguments as the runtime wrote them,
// and compares a tool-call ID's arguments by their canonical form: the
// same arguments in another order are the same call, continued as first
// written; names alike but for case in another order are other arguments
// to a tool that reads them into a struct, so they are refused.
func TestCallerJournalsTheArgumentsAsWrittenAndComparesThemCanonically(t *testing.T) {
	m := &mailServer{}
	j := openSQLite(t)
	c := openCaller(t, j, serveMail(t, m, newGuard(t, idemmcp.GuardConfig{}), nil))
	ctx := context.Background()

	first := json.RawMessage(`{"to":"ann@example.com", "subject":"hi"}`)
	_, err := c.Call(ctx, "call_order", "send_email", first)
	require.NoError(t, err)
	rec, err := j.Lookup(ctx, "mcp", "call_order")
	require.NoError(t, err)
	assert.Equal(t, `{"to":"ann@example.com","subject":"hi"}`, string(rec.Body), "journaled as written (compacted by json.Marshal)")

	res, err := c.Call(ctx, "call_order", "send_email", json.RawMessage(`{"subject":"hi","to":"ann@example.com"}`))
	require.NoError(t, err, "the same arguments in another order are the same call")
	assert.NotNil(t, res)
	assert.EqualValues(t, 1, m.runs.Load())

	_, err = c.Call(ctx, "call_order", "send_email", json.RawMessage(`{"subject":"hi","to":"bob@example.com"}`))
	assert.ErrorIs(t, err, idem.ErrFingerprintMismatch)

	_, _ = c.Call(ctx, "call_fold", "send_email", json.RawMessage(`{"to":"ann@example.com","To":"bob@example.com"}`))
	_, err = c.Call(ctx, "call_fold", "send_email", json.RawMessage(`{"To":"bob@example.com","to":"ann@example.com"}`))
	if err != nil && !errors.Is(err, idem.ErrInvalidOp) { // refused as ambiguous by Canonical keeps the promise too
		assert.ErrorIs(t, err, idem.ErrFingerprintMismatch)
	} else {
		assert.ErrorIs(t, err, idem.ErrInvalidOp)
	}
}
