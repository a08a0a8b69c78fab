package idem_test

import (
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
