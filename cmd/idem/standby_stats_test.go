package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/operator"
)

// On a hot standby the journal cannot tell which workers are alive
// (postgres.ErrLivenessUnknown, tested against a real standby in
// postgres/owners_standby_test.go): idem stats says so, and shows each
// worker by its leases rather than as gone. (A standby cannot be started
// from this module's tests: the helper that starts one is internal to the
// postgres module.)
func TestStatsSaysLivenessIsUnknownOnAStandby(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	until := now.Add(time.Hour)
	s := operator.Stats{Journal: "postgres://127.0.0.1/test", ByState: map[string]int{},
		LivenessUnknown: operator.ErrLivenessUnknown.Error(),
		Workers:         []operator.Worker{{Owner: "worker-a", Status: "holding", Operations: 1, OldestLease: &until}}}
	var out bytes.Buffer
	e := &env{stdout: &out, stderr: &out, now: func() time.Time { return now }}
	require.NoError(t, printStats(e, s, true))
	assert.Contains(t, out.String(), "  liveness unknown on a standby: run this against the primary; the statuses below are the leases'\n")
	assert.Regexp(t, `(?m)^  worker-a +holding +1 +until `, out.String())

	out.Reset()
	s.LivenessUnknown = ""
	require.NoError(t, printStats(e, s, true))
	assert.NotContains(t, out.String(), "liveness unknown", "said only when it is")
}
