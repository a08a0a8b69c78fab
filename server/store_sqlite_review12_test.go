package server_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

// A key store the operator named ".idem-new-keys.db" is taken by its own
// open for a dead creator's temporary file and unlinked, with its -wal
// and -shm, right after OpenSQLiteStore returned it: the server runs on
// an unlinked file, and every stored response is gone at restart (the
// next open creates an empty store, which removes itself again). What
// the operator sees: nothing, until retried requests run twice after a
// restart. Wrong: only names the package made itself may be removed.
func TestReview12StoreNamedLikeATemporaryFileIsNotRemovedByItsOwnOpen(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), ".idem-new-keys.db")
	s, err := server.OpenSQLiteStore(path)
	require.NoError(t, err)
	defer s.Close()
	_, err = os.Stat(path)
	assert.NoError(t, err, "the open key store's file must still be at its path")
}
