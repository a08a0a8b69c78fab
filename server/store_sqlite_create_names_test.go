package server_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

// A key store's name may be as long as SQLite allows for it and its -wal
// and -shm (NAME_MAX less four). A new file is built under a temporary
// name first, which must not make such a name unusable.
func TestSQLiteStoreWithALongNameIsCreated(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), strings.Repeat("k", 242)+".db")
	s, err := server.OpenSQLiteStore(path)
	require.NoError(t, err, "a name SQLite can keep its -wal and -shm beside")
	require.NoError(t, s.Close())
}
