package idem_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A journal's name may be as long as the file system allows for the
// journal and its -wal, -shm and -journal beside it (NAME_MAX less four).
// A new file is built under a temporary name first, which must not make
// a name that SQLite itself handles unusable (a name derived from the
// journal's, fifteen bytes longer, did).
func TestSQLiteJournalWithALongNameIsCreated(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// 245 bytes: with "-wal" or "-shm" it is 249, under Linux's 255.
	path := filepath.Join(dir, strings.Repeat("j", 242)+".db")
	j, err := idem.OpenSQLite(path)
	require.NoError(t, err, "a name SQLite can keep its -wal and -shm beside")
	defer j.Close()
	_, _, err = j.Create(context.Background(), testRecord("s", "op-1", []byte("body")))
	require.NoError(t, err)
}
