package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLsTable(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)
	r := idemOn(t, path, "ls")
	requireOK(t, r)

	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	require.Len(t, lines, 1+len(recs))
	assert.Regexp(t, `^KEY +SCOPE +ID +STATE +ATTEMPTS +AGE +LAST ERROR$`, lines[0])
	for name, rec := range recs {
		var found []string
		for _, l := range lines[1:] {
			if strings.HasPrefix(l, rec.Key+" ") {
				found = append(found, l)
			}
		}
		require.Len(t, found, 1, "row of %s", name)
		fields := strings.Fields(found[0])
		assert.Equal(t, rec.Scope, fields[1], name)
		assert.Contains(t, fields, rec.State.String(), name)
	}
	// Oldest first: the rows come in the order the records were created.
	assert.True(t, strings.HasPrefix(lines[1], recs[rPending].Key))

	// Long IDs and errors are shortened, with an ellipsis; bodies never
	// appear.
	unknownRow := rowOf(t, lines, recs[rUnknown].Key)
	assert.NotContains(t, unknownRow, longID)
	assert.Contains(t, unknownRow, longID[:19]+"…"+longID[len(longID)-20:])
	assert.NotContains(t, unknownRow, longError)
	assert.Contains(t, unknownRow, longError[:40])
	assert.Contains(t, unknownRow, "…")
	assert.NotContains(t, r.stdout, pendingBody)
	assert.NotContains(t, r.stdout, responseBody)
}

func rowOf(t *testing.T, lines []string, key string) string {
	t.Helper()
	for _, l := range lines {
		if strings.HasPrefix(l, key+" ") {
			return l
		}
	}
	t.Fatalf("no row for %s", key)
	return ""
}

func TestLsJSON(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)
	r := idemOn(t, path, "ls", "--json")
	requireOK(t, r)
	objs := jsonLines(t, r.stdout)
	require.Len(t, objs, len(recs))
	byKey := map[string]map[string]any{}
	for _, o := range objs {
		byKey[o["key"].(string)] = o
		for _, field := range []string{"body", "header", "response", "history"} {
			assert.NotContains(t, o, field, "ls --json prints no bodies")
		}
	}
	for name, rec := range recs {
		o := byKey[rec.Key]
		require.NotNil(t, o, name)
		assert.Equal(t, rec.Scope, o["scope"], name)
		assert.Equal(t, rec.ID, o["id"], name)
		assert.Equal(t, rec.State.String(), o["state"], name)
		assert.Equal(t, rec.URL, o["url"], name)
		assert.EqualValues(t, rec.Attempts, o["attempts"], name)
		assert.EqualValues(t, rec.Version, o["version"], name)
	}
	assert.EqualValues(t, 201, byKey[recs[rSucceeded].Key]["status_code"])
	assert.Equal(t, longError, byKey[recs[rUnknown].Key]["last_error"], "JSON is never shortened")
	assert.NotContains(t, r.stdout, pendingBody)
}

func TestLsFilters(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)
	waitPastMillis(latestUpdate(recs))
	keys := func(names ...string) []string {
		var ks []string
		for _, n := range names {
			ks = append(ks, recs[n].Key)
		}
		return ks
	}
	all := keys(rPending, rInFlight, rUnknown, rSucceeded, rRejected, rExpired, rCanceled, rBinary)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--state", "pending"}, keys(rPending)},
		{[]string{"--state", "pending,unknown,in-flight"}, keys(rPending, rInFlight, rUnknown)},
		{[]string{"--state", "succeeded", "--state", "rejected"}, keys(rSucceeded, rRejected, rBinary)},
		{[]string{"--scope", "tenant-b"}, keys(rRejected, rExpired, rBinary)},
		{[]string{"--scope", "tenant-b", "--state", "expired"}, keys(rExpired)},
		{[]string{"--scope", "nobody"}, nil},
		{[]string{"--older-than", "0s"}, all},
		{[]string{"--older-than", "1h"}, nil},
		{[]string{"--older-than", "7d"}, nil},
		{[]string{"--older-than", "0d", "--state", "canceled"}, keys(rCanceled)},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := idemOn(t, path, append([]string{"ls", "--json"}, tc.args...)...)
			requireOK(t, r)
			assert.Equal(t, tc.want, keysOf(jsonLines(t, r.stdout)))
		})
	}

	r := idemOn(t, path, "ls", "--scope", "nobody")
	requireOK(t, r)
	assert.Equal(t, "no operations\n", r.stdout)
}

func TestLsEmptyJournal(t *testing.T) {
	t.Parallel()
	path, j := openTestJournal(t)
	require.NoError(t, j.Close())
	r := idemOn(t, path, "ls", "--json")
	requireOK(t, r)
	assert.Empty(t, r.stdout)
}

// An empty --owner or --scope is a mistake (an unset shell variable, as
// often as not), not a wish to list everything: a usage error, nothing
// listed.
func TestLsEmptyOwnerOrScope(t *testing.T) {
	t.Parallel()
	path, _ := standardJournal(t)
	for _, flagName := range []string{"--owner", "--scope"} {
		for _, args := range [][]string{{"ls", flagName, ""}, {"ls", flagName + "=", "--json"}} {
			r := idemOn(t, path, args...)
			requireOneLineError(t, r, exitUsage, "ls: invalid value \"\" for flag -"+strings.TrimPrefix(flagName, "--")+": is empty")
			assert.Contains(t, r.stderr, "(see 'idem help ls')")
		}
	}
}
