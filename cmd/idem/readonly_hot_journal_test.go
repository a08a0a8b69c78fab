package main

import (
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// leaveHotJournal copies the journal at src to dst as a process killed in
// the middle of a write in rollback-journal mode leaves it: the file with
// the write's pages spilled into it, and beside it the rollback journal
// that holds the pages as they were (hot: no process holds a lock on the
// copies). The write is made, and the copies taken, while its transaction
// is open; it is then rolled back at src.
func leaveHotJournal(t *testing.T, src, dst string) {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+src)
	require.NoError(t, err)
	defer db.Close()
	db.SetMaxOpenConns(1)
	for _, q := range []string{"PRAGMA journal_mode=DELETE", "PRAGMA cache_size=1", "BEGIN IMMEDIATE",
		"CREATE TABLE spill(b BLOB)",
		"INSERT INTO spill SELECT zeroblob(4096) FROM (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 64) SELECT i FROM n)"} {
		_, err := db.Exec(q)
		require.NoError(t, err, q)
	}
	for _, suffix := range []string{"", "-journal"} {
		b, err := os.ReadFile(src + suffix)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(dst+suffix, b, 0o600))
	}
	_, err = db.Exec("ROLLBACK")
	require.NoError(t, err)
}

// A reading command (ls, stats, show, ui) opens the journal read-only,
// which promises to change nothing: beside a hot rollback journal it
// refuses, both files left as they were, and names the command that rolls
// the write back; that command does, and the reading command then reads.
func TestReadingCommandRefusesAJournalLeftMidWrite(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "journal-v5.db"))
	require.NoError(t, err)
	src := filepath.Join(t.TempDir(), "v5.db")
	require.NoError(t, os.WriteFile(src, b, 0o600))
	path := filepath.Join(dir, "ops.db")
	leaveHotJournal(t, src, path)
	before := dirContents(t, dir)
	require.Contains(t, before, path+"-journal")

	for _, cmd := range []string{"ls", "stats"} {
		r := cli(t, dir, nil, "--journal", "ops.db", cmd)
		requireOneLineError(t, r, 1, "idem --journal ops.db migrate")
		assert.Contains(t, r.stderr, "ops.db-journal", cmd)
		assert.Equal(t, before, dirContents(t, dir), "%s changed nothing", cmd)
	}

	r := cli(t, dir, nil, "--journal", "ops.db", "migrate")
	requireOK(t, r)
	assert.Equal(t, "journal ops.db is at schema version 6\n", r.stdout,
		"the version before the roll-back is not known: no claim that nothing was done")
	_, err = os.Stat(path + "-journal")
	assert.ErrorIs(t, err, os.ErrNotExist, "the write was rolled back")
	r = cli(t, dir, nil, "--journal", "ops.db", "ls")
	requireOK(t, r)
	assert.False(t, strings.Contains(r.stdout, "spill"))
}
