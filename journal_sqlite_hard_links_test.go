package idem_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// SQLite keeps the -wal and -shm beside the name it opened, so a journal
// file with two names (hard links) opened by each name has two WALs:
// what one process commits is invisible to the other, and a checkpoint
// of one WAL can overwrite pages the other's holds (SQLite's "How To
// Corrupt An SQLite Database File", 2.5 "Multiple links to the same
// file"). Such a file is refused, by each name, changing nothing in the
// directory, with an error that says how many names it has, why that is
// unsafe and what to do.
func TestSQLiteJournalWithASecondHardLinkIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, b := filepath.Join(dir, "ops.db"), filepath.Join(dir, "other.db")
	j := openJournal(t, a)
	_, _, err := j.Create(context.Background(), testRecord("s", "op-1", []byte("body")))
	require.NoError(t, err)
	require.NoError(t, j.Close())
	require.NoError(t, os.Link(a, b))

	before := dirFiles(t, dir)
	for _, name := range []string{a, b} {
		for _, opts := range [][]idem.SQLiteOption{nil, {idem.SQLiteReadOnly()}} {
			j, err := idem.OpenSQLite(name, opts...)
			if err == nil {
				require.NoError(t, j.Close())
			}
			require.Error(t, err, "opening %s (%d options), a file with two names", name, len(opts))
			assertHardLinksError(t, err, name)
			assert.Equal(t, before, dirFiles(t, dir), "a refused open of %s changes nothing", name)
		}
	}
}

// A process has the journal open by one name, so a WAL holding its
// commits is beside that name; a second process given the other name
// must not open it (it would read the file without that WAL).
func TestSQLiteJournalWithASecondHardLinkIsRefusedWhileOpenByTheOther(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, b := filepath.Join(dir, "ops.db"), filepath.Join(dir, "other.db")
	j := openJournal(t, a)
	_, _, err := j.Create(context.Background(), testRecord("s", "op-1", []byte("body")))
	require.NoError(t, err)
	require.NoError(t, os.Link(a, b))
	_, err = os.Stat(a + "-wal")
	require.NoError(t, err, "the open journal's WAL is beside %s", a)

	j2, err := idem.OpenSQLite(b)
	if err == nil {
		require.NoError(t, j2.Close())
	}
	require.Error(t, err, "opening %s while %s is open with its WAL", b, a)
	assertHardLinksError(t, err, b)
	assert.Contains(t, err.Error(), "ops.db beside it")
	assert.Contains(t, err.Error(), "first let ops.db-wal, which holds commits, reach the file: sqlite3 "+a+" 'PRAGMA wal_checkpoint(TRUNCATE)'")
	_, err = os.Stat(b + "-wal")
	assert.ErrorIs(t, err, os.ErrNotExist, "no WAL was made beside %s", b)
	require.NoError(t, j.Close())
}

// A symbolic link is one name more in the directory, not one more name
// of the file: the journal opens by it (and the file still has one name).
func TestSQLiteJournalThroughASymlinkIsNotTakenForAHardLink(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, l := filepath.Join(dir, "ops.db"), filepath.Join(dir, "link.db")
	require.NoError(t, openJournal(t, a).Close())
	require.NoError(t, os.Symlink(a, l))
	require.NoError(t, openJournal(t, l).Close())
	j, err := idem.OpenSQLite(l, idem.SQLiteReadOnly())
	require.NoError(t, err)
	require.NoError(t, j.Close())
}

func assertHardLinksError(t *testing.T, err error, path string) {
	t.Helper()
	assert.ErrorIs(t, err, idem.ErrJournalHardLinks)
	var fe *idem.FileError
	if assert.True(t, errors.As(err, &fe), "%v is a *FileError", err) {
		assert.Equal(t, path, fe.Path)
	}
	for _, want := range []string{path, "2 names (hard links)", "-wal", "one name"} {
		assert.Contains(t, err.Error(), want)
	}
}
