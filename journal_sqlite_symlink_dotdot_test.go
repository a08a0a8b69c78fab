package idem_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A link to a journal not yet created may name its target through a
// directory that is itself a link, then "..": the kernel resolves the
// link's directory before the "..", as it does for every path (touch(1)
// through this link creates releases/v1/ops.db). Open must too, not read
// the target as a lexical path, which here names the link itself.
func TestSQLiteJournalCreatedThroughALinkWhoseTargetGoesUpFromALinkedDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	real := filepath.Join(dir, "releases", "v1", "data")
	require.NoError(t, os.MkdirAll(real, 0o700))
	// current -> releases/v1/data; ops.db -> current/../ops.db names
	// releases/v1/ops.db, not dir/ops.db.
	require.NoError(t, os.Symlink(filepath.Join("releases", "v1", "data"), filepath.Join(dir, "current")))
	link := filepath.Join(dir, "ops.db")
	require.NoError(t, os.Symlink("current/../ops.db", link))

	j, err := idem.OpenSQLite(link)
	require.NoError(t, err)
	_, _, err = j.Create(context.Background(), testRecord("s", "op-1", []byte("body")))
	require.NoError(t, err)
	require.NoError(t, j.Close())

	want := filepath.Join(dir, "releases", "v1", "ops.db")
	require.Equal(t, want, j.Path())
	_, err = os.Stat(want)
	require.NoError(t, err)
}

// The same, where the lexical reading of the link's target names another
// file than the kernel's: the journal must be created where the link
// points (releases/v1/other.db), so that the link, and any process given
// the target's real path, find the same file.
func TestSQLiteJournalCreatedThroughADotDotLinkIsTheFileTheLinkNames(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "releases", "v1", "data"), 0o700))
	require.NoError(t, os.Symlink(filepath.Join("releases", "v1", "data"), filepath.Join(dir, "current")))
	link := filepath.Join(dir, "ops.db")
	require.NoError(t, os.Symlink("current/../other.db", link))

	j, err := idem.OpenSQLite(link)
	require.NoError(t, err)
	_, _, err = j.Create(context.Background(), testRecord("s", "op-1", []byte("body")))
	require.NoError(t, err)
	require.NoError(t, j.Close())

	want := filepath.Join(dir, "releases", "v1", "other.db")
	require.Equal(t, want, j.Path(), "the journal was created where the link does not point")
	_, err = os.Stat(want)
	require.NoError(t, err)
}

// A path given to Open may itself go up out of a linked directory:
// "current/../ops.db", with current -> releases/v1/data, names
// releases/v1/ops.db to the kernel and to every other program. Open must
// open that journal, not clean the path lexically into a sibling of
// "current" and create a new, empty journal there.
func TestSQLiteJournalPathGoingUpOutOfALinkedDirOpensTheFileItNames(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "releases", "v1", "data"), 0o700))
	require.NoError(t, os.Symlink("releases/v1/data", filepath.Join(dir, "current")))
	real := filepath.Join(dir, "releases", "v1", "ops.db")
	j, err := idem.OpenSQLite(real)
	require.NoError(t, err)
	_, _, err = j.Create(context.Background(), testRecord("s", "op-1", []byte("body")))
	require.NoError(t, err)
	require.NoError(t, j.Close())

	j, err = idem.OpenSQLite(dir+"/current/../ops.db", idem.SQLiteMustExist())
	require.NoError(t, err, "the path names %s, which exists", real)
	defer j.Close()
	require.Equal(t, real, j.Path())
	_, err = j.Lookup(context.Background(), "s", "op-1")
	require.NoError(t, err)
}

// A link whose target ends in "/" names a directory (a data directory not
// yet mounted or made): the kernel refuses to create a file through it
// (EISDIR), and so must Open, rather than create the journal as a file
// where that directory is to be, which then blocks its creation.
func TestSQLiteJournalThroughALinkToAMissingDirectoryIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	link := filepath.Join(dir, "ops.db")
	require.NoError(t, os.Symlink("data/", link))
	_, err := os.OpenFile(link, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	require.Error(t, err, "the kernel creates no file through it")

	j, err := idem.OpenSQLite(link)
	if err == nil {
		t.Logf("created %s", j.Path())
		require.NoError(t, j.Close())
	}
	require.ErrorIs(t, err, idem.ErrJournalPath)
	_, err = os.Lstat(filepath.Join(dir, "data"))
	require.ErrorIs(t, err, os.ErrNotExist, "a file was made where the link's directory is to be")
}
