package sqlitefile

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A path that is a symbolic link, to a file or to a file not created yet,
// relative or absolute, through a linked directory or not, is resolved
// once at Open: Path names the file SQLite writes, so that the WAL this
// package fsyncs and the files kept beside it are the same whatever link
// each process was given. A dangling link's target is created 0600.
func TestOpenThroughSymlinksUsesTheFilesOwnPath(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	data := filepath.Join(dir, "data")
	require.NoError(t, os.Mkdir(data, 0o700))
	require.NoError(t, os.Symlink("data", filepath.Join(dir, "current"))) // a linked directory
	target := filepath.Join(data, "t.db")
	require.NoError(t, os.Symlink("data/t.db", filepath.Join(dir, "rel.db"))) // dangling until created
	require.NoError(t, os.Symlink(filepath.Join(dir, "rel.db"), filepath.Join(dir, "abs.db")))

	o := Options{What: "test file", AppID: 0x74657374, Migrations: testSchema}
	for _, p := range []string{filepath.Join(dir, "abs.db"), filepath.Join(dir, "rel.db"), target, filepath.Join(dir, "current", "t.db")} {
		db, err := Open(context.Background(), p, o)
		require.NoError(t, err, p)
		assert.Equal(t, target, db.Path(), "opened as %s", p)
		require.NoError(t, db.Write(context.Background(), Durable, put(p, "v")))
		fi, err := os.Stat(target + "-wal")
		if assert.NoError(t, err, "the WAL is beside the target") {
			assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
		}
		require.NoError(t, db.Close())
	}
	fi, err := os.Stat(target)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "created through a dangling link")
	for _, n := range []string{"abs.db", "rel.db"} {
		fi, err := os.Lstat(filepath.Join(dir, n))
		require.NoError(t, err)
		assert.NotZero(t, fi.Mode()&os.ModeSymlink, "%s is still a link", n)
	}
}
