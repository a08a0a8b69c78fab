package idem_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

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
	assert.Equal(t, 6, userVersion(t, path), "the journal was migrated to the current schema (6)")
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

// testdata/journal-v5.db was written by the code of schema 5 (3f24f53),
// whose due index is in ascending state order: three pending operations
// (k-due-first due at 12:00, k-due-second at 12:01, k-later in a century)
// and one settled (k-settled, 201). Schema 6 rebuilds the index in
// descending state order; what Claim finds, and in which order, is the same.
func TestSQLiteMigratesASchema5JournalsDueIndex(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	b, err := os.ReadFile("testdata/journal-v5.db")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o600))
	require.Equal(t, 5, userVersion(t, path), "the fixture is a schema-5 journal")

	ctx := context.Background()
	j := openJournal(t, path)
	claimed, err := j.Claim(ctx, idem.ClaimRequest{Owner: "worker", Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	var keys []string
	for _, rec := range claimed {
		keys = append(keys, rec.Key)
	}
	assert.Equal(t, []string{"k-due-first", "k-due-second"}, keys, "the due ones, oldest due first")
	settled, err := j.Get(ctx, "k-settled")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, settled.State)
	require.NotNil(t, settled.Response)
	assert.Equal(t, 201, settled.Response.StatusCode)
	evs, err := j.History(ctx, "k-settled")
	require.NoError(t, err)
	assert.Len(t, evs, 2, "the settled operation's derived history")
	require.NoError(t, j.Close())

	assert.Equal(t, 6, userVersion(t, path), "the journal was migrated to the current schema (6)")
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	var desc int
	require.NoError(t, db.QueryRow(`SELECT "desc" FROM pragma_index_xinfo('operations_due') WHERE name = 'state'`).Scan(&desc))
	assert.Equal(t, 1, desc, "the due index is in descending state order")
	openJournal(t, path) // and opens again as it is
}
