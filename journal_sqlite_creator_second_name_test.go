package idem_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A creator killed after it linked the new file to its path and before it
// removed its temporary name leaves that name (.idem-new-*) as a second
// name of the journal. SQLite never opens it, so it is not counted among
// the journal's names (see ErrJournalHardLinks): the journal opens, for
// writing and read-only. Nothing removes it: no open can tell a dead
// creator's file from a live one's, or from a user's file named so.
func TestSQLiteCreatorsLeftoverNameDoesNotLockTheJournalOut(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "ops.db")
	require.NoError(t, openJournal(t, path).Close())
	leftover := filepath.Join(dir, ".idem-new-123")
	require.NoError(t, os.Link(path, leftover))

	j, err := idem.OpenSQLite(path, idem.SQLiteReadOnly())
	require.NoError(t, err, "the creator's temporary name is not a name SQLite opens")
	require.NoError(t, j.Close())
	require.NoError(t, openJournal(t, path).Close())
	_, err = os.Stat(leftover)
	require.NoError(t, err, "an open removes no file of the directory")
}

// A user's journal whose name begins like a creator's temporary file is an
// ordinary journal: its open, and another journal's beside it, leave it
// and its contents where they are.
func TestSQLiteJournalNamedLikeATemporaryFileIsKept(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, ".idem-new-ops.db")
	j := openJournal(t, path)
	_, _, err := j.Create(context.Background(), testRecord("kept", "1", []byte("{}")))
	require.NoError(t, err)
	require.NoError(t, openJournal(t, filepath.Join(dir, "other.db")).Close())
	require.NoError(t, j.Close())
	_, err = os.Stat(path)
	require.NoError(t, err)
	j = openJournal(t, path)
	counts, err := j.Count(context.Background())
	require.NoError(t, err)
	require.Len(t, counts, 1, "the journal kept its record")
	require.Equal(t, 1, counts[0].N, "the journal kept its record")
	require.NoError(t, j.Close())
}
