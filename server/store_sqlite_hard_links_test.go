package server_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

// A key store with two names (hard links) would have a WAL beside each
// name it is opened by, and claims committed in one invisible to the
// processes using the other: two of them could run one request. It is
// refused by each name, changing nothing, even while a process has it
// open (and its WAL) by the other name.
func TestSQLiteStoreWithASecondHardLinkIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, b := filepath.Join(dir, "keys.db"), filepath.Join(dir, "other.db")
	s, err := server.OpenSQLiteStore(a)
	require.NoError(t, err)
	now := time.Now()
	res, err := s.Claim(context.Background(), server.ClaimRequest{
		Key: "k", Fingerprint: "fp", Method: "POST", Path: "/orders",
		Now: now, ExpiresAt: now.Add(time.Hour), StaleBefore: now.Add(-time.Minute),
	})
	require.NoError(t, err)
	require.True(t, res.Claimed)
	require.NoError(t, os.Link(a, b))

	for _, name := range []string{b, a} {
		s2, err := server.OpenSQLiteStore(name)
		if err == nil {
			require.NoError(t, s2.Close())
		}
		require.Error(t, err, "opening %s, a file with two names", name)
		assert.ErrorIs(t, err, server.ErrStoreHardLinks)
		var fe *server.FileError
		if assert.True(t, errors.As(err, &fe), "%v is a *FileError", err) {
			assert.Equal(t, name, fe.Path)
		}
		for _, want := range []string{name, "2 names (hard links)", "-wal", "one name"} {
			assert.Contains(t, err.Error(), want)
		}
	}
	_, err = os.Stat(b + "-wal")
	assert.ErrorIs(t, err, os.ErrNotExist, "no WAL was made beside %s", b)
	require.NoError(t, s.Close())
}
