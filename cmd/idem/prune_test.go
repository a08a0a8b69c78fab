package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func TestPrune(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)
	waitPastMillis(latestUpdate(recs))
	before := takeSnapshot(t, path)

	// Nothing was updated an hour ago.
	r := idemOn(t, path, "prune", "--older-than", "1h", "--dry-run")
	requireOK(t, r)
	assert.Regexp(t, `^would prune 0 operation\(s\) settled and last updated before \S+ \(dry run: nothing deleted\)\n$`, r.stdout)
	r = idemOn(t, path, "prune", "--older-than", "1d")
	requireOK(t, r)
	assert.Regexp(t, `^pruned 0 operation\(s\) `, r.stdout)
	assert.Equal(t, before, takeSnapshot(t, path))

	// A dry run counts what a prune deletes, and deletes nothing.
	r = idemOn(t, path, "prune", "--older-than", "0s", "--dry-run")
	requireOK(t, r)
	assert.Regexp(t, `^would prune 4 operation\(s\) `, r.stdout)
	assert.Equal(t, before, takeSnapshot(t, path))

	r = idemOn(t, path, "prune", "--dry-run", "--older-than", "0s")
	requireOK(t, r)
	assert.Regexp(t, `^would prune 4 operation\(s\) `, r.stdout)

	r = idemOn(t, path, "prune", "--older-than", "0s")
	requireOK(t, r)
	assert.Regexp(t, `^pruned 4 operation\(s\) settled and last updated before \S+\n$`, r.stdout)

	// Settled operations are gone with their history; unsettled and
	// expired ones stay, unchanged.
	after := takeSnapshot(t, path)
	var kept []string
	for _, rec := range after.Records {
		kept = append(kept, rec.Key)
		assert.False(t, rec.State.Terminal())
	}
	assert.ElementsMatch(t, []string{recs[rPending].Key, recs[rInFlight].Key, recs[rUnknown].Key, recs[rExpired].Key}, kept)
	for _, name := range []string{rSucceeded, rRejected, rCanceled, rBinary} {
		assert.NotContains(t, after.History, recs[name].Key)
	}
	for _, rec := range after.Records {
		assert.Equal(t, before.History[rec.Key], after.History[rec.Key])
	}

	r = idemOn(t, path, "prune", "--older-than", "0s", "--dry-run")
	requireOK(t, r)
	assert.Regexp(t, `^would prune 0 operation\(s\) `, r.stdout)
	require.Equal(t, idem.StateExpired, getRecord(t, path, recs[rExpired].Key).State)
}
