package main

import (
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readCommands are the commands that only read the journal.
var readCommands = [][]string{{"ls"}, {"ls", "--json"}, {"ls", "--owner", "w"}, {"stats"}, {"stats", "--json"}}

// A journal of an older schema is not migrated by a command that only
// reads: it is refused, with the command that migrates it, and the files
// stay byte for byte as they were. "idem migrate" then migrates it.
func TestReadCommandsDoNotMigrate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "ops.db")
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "journal-v1.db"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o600))
	before := dirContents(t, dir)

	for _, args := range append(readCommands, []string{"show", "default/pending"}) {
		r := idemOn(t, path, args...)
		requireOneLineError(t, r, 1, "idem --journal "+path+" migrate")
		assert.Contains(t, r.stderr, "schema version 1", "idem %v", args)
		assert.Equal(t, before, dirContents(t, dir), "idem %v changed the files", args)
	}
	r := idemOn(t, path, "ui")
	requireOneLineError(t, r, 1, "idem --journal "+path+" migrate")
	assert.Equal(t, before, dirContents(t, dir), "idem ui changed the files")

	r = idemOn(t, path, "migrate")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "from schema version 1 to 6")
	r = idemOn(t, path, "ls", "--json")
	requireOK(t, r)
	assert.Len(t, jsonLines(t, r.stdout), 3)
	r = idemOn(t, path, "migrate")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "already at schema version 6")
}

// On a journal of this build's schema, the read commands leave the
// directory as they found it: no file changed, none created (no lock
// file of an owner, no -wal or -shm left behind).
func TestReadCommandsChangeNoFile(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)
	dir := filepath.Dir(path)
	before := dirContents(t, dir)
	for _, args := range append(readCommands, []string{"show", recs[rUnknown].Key}, []string{"show", "--json", "--body", recs[rBinary].Key}) {
		requireOK(t, idemOn(t, path, args...))
		assert.Equal(t, before, dirContents(t, dir), "idem %v changed the files", args)
	}
}

// A journal written by a newer idem is refused by every command, read or
// write, with one line, and left as it was.
func TestNewerSQLiteJournal(t *testing.T) {
	t.Parallel()
	path, _ := standardJournal(t)
	db, err := sql.Open("sqlite3", path)
	require.NoError(t, err)
	_, err = db.Exec("PRAGMA user_version = 99")
	require.NoError(t, err)
	require.NoError(t, db.Close())
	dir := filepath.Dir(path)
	before := dirContents(t, dir)
	for _, args := range append(readCommands, []string{"show", "k"}, []string{"ui"}, []string{"migrate"},
		[]string{"cancel", "k"}, []string{"prune", "--older-than", "1d"}) {
		r := idemOn(t, path, args...)
		requireOneLineError(t, r, exitError, "schema is newer than this build supports")
		assert.Equal(t, before, dirContents(t, dir), "idem %v changed the files", args)
	}
}
