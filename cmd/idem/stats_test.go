package main

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/operator"
)

func TestStats(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)

	r := idemOn(t, path, "stats", "--json")
	requireOK(t, r)
	var s operator.Stats
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &s))
	assert.Equal(t, len(recs), s.Total)
	assert.Equal(t, map[string]int{"pending": 1, "in_flight": 1, "unknown": 1, "succeeded": 2, "rejected": 1,
		"expired": 1, "canceled": 1}, s.ByState)
	require.Len(t, s.ByScope, 2)
	assert.Equal(t, operator.ScopeCount{Scope: "default", Total: 5,
		ByState: map[string]int{"pending": 1, "in_flight": 1, "unknown": 1, "succeeded": 1, "canceled": 1}}, s.ByScope[0])
	assert.Equal(t, operator.ScopeCount{Scope: "tenant-b", Total: 3,
		ByState: map[string]int{"rejected": 1, "expired": 1, "succeeded": 1}}, s.ByScope[1])
	// The oldest unsettled operation is the first one journaled: pending.
	require.NotNil(t, s.OldestUnsettled)
	assert.Equal(t, "pending", s.OldestUnsettled.State)
	assert.Equal(t, "default", s.OldestUnsettled.Scope)
	assert.True(t, s.OldestUnsettled.CreatedAt.Equal(recs[rPending].CreatedAt))
	assert.GreaterOrEqual(t, s.OldestUnsettled.AgeSeconds, int64(0))
	// Size on disk: the file and its WAL.
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, path, s.Journal)
	assert.Positive(t, s.FileBytes)
	assert.LessOrEqual(t, fi.Size(), s.FileBytes+s.WALBytes)
	assert.Equal(t, s.FileBytes+s.WALBytes, s.SizeBytes)

	r = idemOn(t, path, "stats")
	requireOK(t, r)
	for _, want := range []string{"operations        8\n", "oldest unsettled  ", "(pending, scope default, created ",
		"  succeeded  2\n", "  canceled   1\n"} {
		assert.Contains(t, r.stdout, want)
	}
	assert.Regexp(t, `(?m)^  default +5 +1 +1 +1 +1 +0 +0 +1$`, r.stdout)
	assert.Regexp(t, `(?m)^  tenant-b +3 +0 +0 +0 +1 +1 +1 +0$`, r.stdout)
	assert.Regexp(t, `(?m)^size +\d+(\.\d)? [KM]?i?B \(file `, r.stdout)
}

func TestStatsAllSettled(t *testing.T) {
	t.Parallel()
	path, j := openTestJournal(t)
	put(t, j, op{id: "a", path: []idem.State{idem.StateInFlight, idem.StateSucceeded},
		resp: &idem.Response{StatusCode: 200}})
	require.NoError(t, j.Close())

	r := idemOn(t, path, "stats", "--json")
	requireOK(t, r)
	var s operator.Stats
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &s))
	assert.Nil(t, s.OldestUnsettled)
	assert.Equal(t, 1, s.ByState["succeeded"])
	assert.Equal(t, 0, s.ByState["pending"])

	r = idemOn(t, path, "stats")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "oldest unsettled  none\n")
}
