package idem_test

import (
	"bytes"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// Schema 6 runs the migrations before the file is switched to WAL, so that
// a migration that fails (tables that do not match the file's schema
// version) leaves the file exactly as it was. A schema-5 journal in
// rollback-journal mode whose due index is gone cannot be migrated (DROP
// INDEX operations_due fails): OpenSQLite must refuse it as damaged, name
// it, and leave its bytes, its journal mode and its directory unchanged.
func TestSQLiteFailedSchema6MigrationLeavesTheFileAsItWas(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "ops.db")
	bigSchema5Journal(t, path, 100)
	db, err := sql.Open("sqlite3", "file:"+path)
	require.NoError(t, err)
	var mode string
	require.NoError(t, db.QueryRow("PRAGMA journal_mode=DELETE").Scan(&mode))
	require.Equal(t, "delete", mode)
	_, err = db.Exec("DROP INDEX operations_due")
	require.NoError(t, err)
	require.NoError(t, db.Close())
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	entries := func() []string {
		des, err := os.ReadDir(dir)
		require.NoError(t, err)
		var names []string
		for _, de := range des {
			names = append(names, de.Name())
		}
		return names
	}
	files := entries()

	j, err := idem.OpenSQLite(path)
	if err == nil {
		j.Close()
	}
	require.Error(t, err, "a schema-5 journal without its due index cannot be migrated")
	var fe *idem.FileError
	assert.True(t, errors.As(err, &fe), "a *FileError: %v", err)
	assert.ErrorIs(t, err, idem.ErrJournalCorrupt)
	assert.Contains(t, err.Error(), path)
	after, rerr := os.ReadFile(path)
	require.NoError(t, rerr)
	assert.True(t, bytes.Equal(before, after), "the refused file's bytes are unchanged")
	assert.Equal(t, files, entries(), "no WAL or rollback journal is left beside it")
	assert.Equal(t, 5, userVersion(t, path))
}
