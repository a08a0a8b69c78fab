package server_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

// A creator killed while it built a key store under its temporary name
// (.idem-new-*) leaves that file; no creator is at work in the directory
// (none holds its lock), so the next open of the store removes it, and
// the file's own name is untouched.
func TestSQLiteStoreOpenRemovesADeadCreatorsTemporaryFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.db")
	s, err := server.OpenSQLiteStore(path)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	dead := filepath.Join(dir, ".idem-new-42")
	require.NoError(t, os.WriteFile(dead, []byte("half built"), 0o600))

	s, err = server.OpenSQLiteStore(path)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	_, err = os.Stat(dead)
	assert.ErrorIs(t, err, os.ErrNotExist, "the dead creator's file was removed")
	_, err = os.Stat(path)
	assert.NoError(t, err)
}
