package idem_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// testdata/journal-v1.db was written by the code of schema 1 (before the
// key's wire form was journaled): a client with KeyHeader "X-Request-Key"
// and QuoteKey left one operation settled, one pending and one unknown.
func TestSQLiteMigratesASchema1Journal(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	b, err := os.ReadFile("testdata/journal-v1.db")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o600))
	require.Equal(t, 1, userVersion(t, path), "the fixture is a schema-1 journal")

	ctx := context.Background()
	j := openJournal(t, path)
	var states = map[string]idem.State{}
	for rec, err := range j.List(ctx, idem.Filter{}) {
		require.NoError(t, err)
		states[rec.ID] = rec.State
		assert.Empty(t, rec.KeyHeader, "%s: schema 1 did not journal the key's form", rec.ID)
		assert.False(t, rec.KeyQuoted, rec.ID)
		assert.Zero(t, rec.TransportResends, rec.ID)
		assert.Empty(t, rec.Link, "%s: no link before schema 3", rec.ID)
		assert.NotEmpty(t, rec.Key, rec.ID)
		evs, err := j.History(ctx, rec.Key)
		require.NoError(t, err)
		require.NotEmpty(t, evs)
		assert.Equal(t, idem.EventCreate, evs[0].Kind, "%s: the creation event reads as such", rec.ID)
		for _, ev := range evs[1:] {
			want := idem.EventUpdate
			if ev.To == idem.StateSucceeded {
				want = idem.EventAnswer // the kind its states imply
			}
			assert.Equal(t, want, ev.Kind, "%s: %s → %s", rec.ID, ev.From, ev.To)
		}
	}
	assert.Equal(t, map[string]idem.State{"settled": idem.StateSucceeded, "pending": idem.StatePending,
		"unknown": idem.StateUnknown}, states)
	settled, err := j.Lookup(ctx, "default", "settled")
	require.NoError(t, err)
	require.NotNil(t, settled.Response)
	assert.Equal(t, 201, settled.Response.StatusCode)

	// A record written now keeps its form, the default one included, and its link.
	for _, form := range []struct {
		header string
		quoted bool
	}{{"Idempotency-Key", false}, {"X-Request-Key", true}} {
		rec := testRecord("default", "new-"+form.header, []byte("x"))
		rec.KeyHeader, rec.KeyQuoted = form.header, form.quoted
		rec.Link = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		_, _, err = j.Create(ctx, rec)
		require.NoError(t, err)
		got, err := j.Get(ctx, rec.Key)
		require.NoError(t, err)
		assert.Equal(t, form.header, got.KeyHeader)
		assert.Equal(t, form.quoted, got.KeyQuoted)
		assert.Equal(t, rec.Link, got.Link, "schema 3 keeps the link")
	}
	require.NoError(t, j.Close())
	assert.Equal(t, 5, userVersion(t, path), "the journal was migrated to the current schema (5)")
	openJournal(t, path) // and opens again as it is
}

func userVersion(t *testing.T, path string) int {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	var v int
	require.NoError(t, db.QueryRow("PRAGMA user_version").Scan(&v))
	return v
}
