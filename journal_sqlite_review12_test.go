package idem_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// An outside review of the SQLite file creation (twelfth session). The
// first two tests hold against a removal of creators' leftovers that was
// merged and withdrawn the same session; their comments say what it did.

// A user may name a journal anything, ".idem-new-ops.db" included (a
// hidden file, a name a deploy script derived). Every open for writing
// removed the regular files whose names begin with ".idem-new-" when it
// could take the directory's exclusive flock, taking them for the
// temporary files of creators that died: the journal's own file, and its
// -wal and -shm, are unlinked right after OpenSQLite returned it. What the
// user sees: OpenSQLite succeeds, writes succeed (into an unlinked
// inode), and after Close the journal is gone; the next open creates an
// empty one and every pending operation's record is lost. Wrong: a name
// the user chose must never be taken for a leftover; only names this
// package made itself may be removed.
func TestReview12JournalNamedLikeATemporaryFileIsNotRemovedByItsOwnOpen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, ".idem-new-ops.db")
	j, err := idem.OpenSQLite(path)
	require.NoError(t, err)
	rec := testRecord("s", "op-1", []byte("body"))
	_, _, err = j.Create(context.Background(), rec)
	require.NoError(t, err)
	_, err = os.Stat(path)
	assert.NoError(t, err, "the journal's own file must still be at its path while it is open")
	require.NoError(t, j.Close())

	j, err = idem.OpenSQLite(path)
	require.NoError(t, err)
	defer j.Close()
	_, err = j.Get(context.Background(), rec.Key)
	assert.NoError(t, err, "the record committed before Close must be found after reopening %s", path)
}

// The same, seen from beside: a journal named ".idem-new-b.db" (made
// under another name and renamed, so that its own open does not remove
// it; see above) is open read-only, as the idem CLI's inspect opens it.
// Opening another journal, ops.db, for writing in the same directory
// removes b's file under the open reader: the user's journal is gone,
// with every record in it, because of an open of a different file.
func TestReview12OpeningAJournalLeavesAnotherJournalInTheDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	made, b := filepath.Join(dir, "b.db"), filepath.Join(dir, ".idem-new-b.db")
	j := openJournal(t, made)
	_, _, err := j.Create(context.Background(), testRecord("s", "op-1", []byte("body")))
	require.NoError(t, err)
	require.NoError(t, j.Close())
	require.NoError(t, os.Rename(made, b))
	jb, err := idem.OpenSQLite(b, idem.SQLiteReadOnly())
	require.NoError(t, err)
	defer jb.Close()

	ja := openJournal(t, filepath.Join(dir, "ops.db"))
	require.NoError(t, ja.Close())
	_, err = os.Stat(b)
	assert.NoError(t, err, "opening ops.db must not remove the journal %s beside it", b)
}

func init() { children["review12-open-journal"] = childReview12OpenJournal }

// childReview12OpenJournal opens the journal at IDEM_TEST_JOURNAL for
// writing and closes it; its error, if any, is the child's.
func childReview12OpenJournal() error {
	j, err := idem.OpenSQLite(os.Getenv("IDEM_TEST_JOURNAL"))
	if err != nil {
		return err
	}
	return j.Close()
}

// nobody is the user the tests below open journals as: root reads any
// directory, so as root (as these tests run) an unlistable directory's
// paths are never taken.
const nobody = 65534

// nobodyBase returns a directory of the test's own that nobody may enter,
// or skips the test when it does not run as root.
func nobodyBase(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a child as another user")
	}
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	return base
}

// openAsNobody opens and closes the journal at path in a child running as
// nobody, from a copy of the test binary in base, and returns what it
// wrote and how it ended.
func openAsNobody(t *testing.T, base, path string) ([]byte, error) {
	t.Helper()
	bin := filepath.Join(base, "idem.test")
	exe, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, exe, 0o755))
	cmd := childCommand(t, "review12-open-journal", "IDEM_TEST_JOURNAL="+path)
	cmd.Path, cmd.Args[0] = bin, bin
	cmd.Stderr = nil
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	return cmd.CombinedOutput()
}

// A creator killed between the link of its new file and the removal of
// its temporary name leaves that name, .idem-new-<n>, as a second hard
// link of the journal. The hard-link check leaves it out only if it can
// list the directory; a process that may write and search the directory
// but not read it (mode 0300, a drop box kept unlistable on purpose)
// cannot tell it from a user's second name, and refuses the journal. It
// said 'it has 2 names (hard links), none of the others beside it',
// sending the user after a name it never made; the refusal now says the
// names cannot be told apart and that a creator's leftover is safe to
// remove.
func TestReview12LeftoverSecondNameInAnUnreadableDirectoryLocksTheJournalOut(t *testing.T) {
	t.Parallel()
	base := nobodyBase(t)
	dir := filepath.Join(base, "drop")
	require.NoError(t, os.Mkdir(dir, 0o700))
	path := filepath.Join(dir, "ops.db")
	j := openJournal(t, path)
	_, _, err := j.Create(context.Background(), testRecord("s", "op-1", []byte("body")))
	require.NoError(t, err)
	require.NoError(t, j.Close())
	// What a creator killed between its link and its removal leaves.
	require.NoError(t, os.Link(path, filepath.Join(dir, ".idem-new-123")))
	for _, p := range []string{dir, path} {
		require.NoError(t, os.Chown(p, nobody, nobody))
	}
	require.NoError(t, os.Chmod(dir, 0o300))

	out, err := openAsNobody(t, base, path)
	require.Error(t, err, "nobody opening its journal in its 0300 directory after a creator's crash: %s", out)
	assert.Contains(t, string(out), "cannot be told apart", "the refusal says why it cannot tell the names apart")
	assert.Contains(t, string(out), ".idem-new-*", "and names the creator's leftover, safe to remove")
	assert.NotContains(t, string(out), "none of the others beside it")
}

// A process that may write and search its directory but not list it
// (mode 0300) could not create its journal there, and found out too late:
// create links the new file to its path, then opens the directory to
// fsync it, which needs read permission; the open's EACCES came back as
// 'the directory must be writable by this process' (it is), with the
// journal already at its path. Creation now opens the directory first,
// and refuses before anything is made, naming the permission missing.
func TestReview12CreatingAJournalInADirectoryItCannotList(t *testing.T) {
	t.Parallel()
	base := nobodyBase(t)
	dir := filepath.Join(base, "drop")
	require.NoError(t, os.Mkdir(dir, 0o300))
	require.NoError(t, os.Chown(dir, nobody, nobody))

	out, err := openAsNobody(t, base, filepath.Join(dir, "ops.db"))
	require.Error(t, err, "nobody creating its journal in its own 0300 directory: %s", out)
	assert.Contains(t, string(out), "must be readable and writable", "the refusal names the permission missing")
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, des, "nothing was made in the directory")
}
