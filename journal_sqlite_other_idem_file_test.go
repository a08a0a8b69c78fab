package idem_test

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/server"
)

// An operator who gives the server's key store where a journal is wanted
// (idem --journal keys.db ls), or an application that opens its journal
// as its key store, is refused (ErrNotJournal, server.ErrNotStore), and
// the error says what the file is: idem's other kind of file, not
// "another program's" database, which sends the operator looking for a
// program that does not exist.
func TestSQLiteOpeningIdemsOtherKindOfFileSaysWhatItIs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	storePath, journalPath := filepath.Join(dir, "keys.db"), filepath.Join(dir, "ops.db")
	s, err := server.OpenSQLiteStore(storePath)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	openJournal(t, journalPath).Close()

	for _, c := range []struct {
		name string
		err  error
		kind error
		is   string
	}{
		{"the key store as a journal", func() error { _, err := idem.OpenSQLite(storePath); return err }(), idem.ErrNotJournal, "key store"},
		{"the key store as a journal, read-only", func() error {
			_, err := idem.OpenSQLite(storePath, idem.SQLiteReadOnly())
			return err
		}(), idem.ErrNotJournal, "key store"},
		{"the journal as a key store", func() error { _, err := server.OpenSQLiteStore(journalPath); return err }(), server.ErrNotStore, "journal"},
	} {
		require.Error(t, c.err, c.name)
		assert.True(t, errors.Is(c.err, c.kind), "%s: %v", c.name, c.err)
		assert.Contains(t, c.err.Error(), "idem "+c.is, "%s: the error says the file is idem's %s", c.name, c.is)
		assert.NotContains(t, c.err.Error(), "another program", c.name)
	}
}
