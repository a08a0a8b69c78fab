package server_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
	"github.com/idemkit/idem/server/storetest"
)

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(*testing.T) server.Store { return server.NewMemoryStore() })
}

func TestSQLiteStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) server.Store { return openSQLite(t) })
}

func TestSQLiteStoreDeferredCompletes(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) server.Store { return openSQLite(t, server.SQLiteDeferCompletes()) })
}

func openSQLite(t testing.TB, opts ...server.SQLiteOption) *server.SQLiteStore {
	t.Helper()
	s, err := server.OpenSQLiteStore(filepath.Join(t.TempDir(), "keys.db"), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

var now0 = time.Date(2031, 1, 2, 3, 4, 5, 6, time.UTC)

func TestSQLiteStoreKeepsEntriesAcrossReopen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keys.db")
	s, err := server.OpenSQLiteStore(path)
	require.NoError(t, err)
	c, err := s.Claim(ctx, server.ClaimRequest{Scope: "t", Key: "k", Fingerprint: "fp", Method: "POST", Path: "/orders",
		Now: now0, ExpiresAt: now0.Add(time.Hour), StaleBefore: now0.Add(-time.Minute)})
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, server.CompleteRequest{Scope: "t", Key: "k", Token: c.Token,
		Response: &server.StoredResponse{Status: 201, Body: []byte("done")}, ExpiresAt: now0.Add(time.Hour)}))
	require.NoError(t, s.Close())

	_, err = s.Get(ctx, "t", "k", now0)
	require.ErrorIs(t, err, server.ErrStoreClosed)
	_, err = s.Claim(ctx, server.ClaimRequest{Scope: "t", Key: "k2", Now: now0})
	require.ErrorIs(t, err, server.ErrStoreClosed)

	s2, err := server.OpenSQLiteStore(path)
	require.NoError(t, err)
	defer s2.Close()
	e, err := s2.Get(ctx, "t", "k", now0)
	require.NoError(t, err)
	assert.Equal(t, server.Completed, e.State)
	assert.Equal(t, "done", string(e.Response.Body))
}

func TestSQLiteStoreFileIsPrivate(t *testing.T) {
	t.Parallel()
	s := openSQLite(t)
	fi, err := os.Stat(s.Path())
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
}

func TestSQLiteStoreRefusesForeignFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()

	other := filepath.Join(dir, "other.db")
	db, err := sql.Open("sqlite3", other)
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE customers (id INTEGER PRIMARY KEY)`)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	_, err = server.OpenSQLiteStore(other)
	require.ErrorIs(t, err, server.ErrNotStore)
	var fe *server.FileError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, other, fe.Path)
	assert.Contains(t, err.Error(), "key store")

	text := filepath.Join(dir, "notes.txt")
	require.NoError(t, os.WriteFile(text, []byte("these are not the bytes of an SQLite database, not at all....."), 0o600))
	_, err = server.OpenSQLiteStore(text)
	require.ErrorIs(t, err, server.ErrNotStore)

	_, err = server.OpenSQLiteStore(dir)
	require.Error(t, err, "a directory is not a store")
}
