package idem_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func init() { children["create-journal-stop-before-link"] = childCreateJournalStopBeforeLink }

// childCreateJournalStopBeforeLink creates the journal at
// IDEM_TEST_JOURNAL and stops once the file is built under its temporary
// name, before it is put at its path: it prints that name and waits to be
// killed.
func childCreateJournalStopBeforeLink() error {
	_, err := idem.OpenSQLite(os.Getenv("IDEM_TEST_JOURNAL"), idem.SQLiteOnBuilt(func(tmp string) {
		fmt.Println(tmp)
		time.Sleep(time.Hour) // a timer: not a deadlock the runtime would end
		os.Exit(3)
	}))
	return err
}

// leftovers lists the names in dir that a creator's temporary file (and
// its -journal, -wal, -shm) have.
func leftovers(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, de := range des {
		if strings.HasPrefix(de.Name(), ".idem-new-") {
			names = append(names, de.Name())
		}
	}
	return names
}

// A new journal is built under a temporary name (.idem-new-*) and then
// put at its path. A creator killed in between (SIGKILL: nothing of it
// runs) leaves the temporary file; the next open in that directory, which
// creates the journal, must remove it, not leave it there for good.
func TestSQLiteCreatorKilledBeforeLinkLeavesNoTemporaryFileForGood(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "ops.db")
	cmd := childCommand(t, "create-journal-stop-before-link", "IDEM_TEST_JOURNAL="+path)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() }) // if the test stops before its kill
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "the child prints its temporary file's name")
	tmp := strings.TrimSpace(line)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	err = cmd.Wait()
	require.Error(t, err)
	require.Equal(t, syscall.SIGKILL, cmd.ProcessState.Sys().(syscall.WaitStatus).Signal(), "the creator was killed: %v", err)
	_, err = os.Stat(tmp)
	require.NoError(t, err, "the killed creator left %s", tmp)
	_, err = os.Stat(path)
	require.ErrorIs(t, err, os.ErrNotExist, "the killed creator did not put the file at its path")

	j := openJournal(t, path)
	assert.Empty(t, leftovers(t, dir), "the next open removed what the killed creator left")
	require.NoError(t, j.Close())
}

// A creator killed after it linked the new file to its path and before it
// removed the temporary name leaves that name as a second name of the
// journal (SQLite never opens it: it is not counted as one). A read-only
// open changes nothing and opens it; the next open for writing removes it.
func TestSQLiteCreatorKilledAfterLinkLeavesNoSecondNameForGood(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "ops.db")
	require.NoError(t, openJournal(t, path).Close())
	require.NoError(t, os.Link(path, filepath.Join(dir, ".idem-new-123")))

	j, err := idem.OpenSQLite(path, idem.SQLiteReadOnly())
	require.NoError(t, err, "the creator's temporary name is not a name SQLite opens")
	require.NoError(t, j.Close())
	assert.Equal(t, []string{".idem-new-123"}, leftovers(t, dir), "a read-only open removes nothing")

	require.NoError(t, openJournal(t, path).Close())
	assert.Empty(t, leftovers(t, dir), "an open for writing removed the dead creator's name")
}

// lockDir holds flock's lock on dir, shared (as a creator at work there
// does) or exclusive, until the test ends or the returned function runs.
func lockDir(t *testing.T, dir string, how int) (unlock func()) {
	t.Helper()
	d, err := os.Open(dir)
	require.NoError(t, err)
	require.NoError(t, syscall.Flock(int(d.Fd()), how|syscall.LOCK_NB))
	t.Cleanup(func() { _ = d.Close() })
	return func() { _ = d.Close() }
}

// A creator at work holds its directory's shared lock while its temporary
// file exists: an open in that directory, creating or opening a journal,
// must leave that file alone (it is not a dead creator's), and removes it
// once the lock is gone. The test holds the lock and makes the file
// itself, as a live creator between its steps.
func TestSQLiteOpenLeavesALiveCreatorsTemporaryFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	live := filepath.Join(dir, ".idem-new-live")
	unlock := lockDir(t, dir, syscall.LOCK_SH)
	require.NoError(t, os.WriteFile(live, []byte("being built"), 0o600))

	path := filepath.Join(dir, "ops.db")
	require.NoError(t, openJournal(t, path).Close(), "a creation beside a live creator")
	require.NoError(t, openJournal(t, path).Close(), "an open beside a live creator")
	b, err := os.ReadFile(live)
	require.NoError(t, err, "a live creator's file is left alone")
	assert.Equal(t, "being built", string(b))
	assert.Equal(t, []string{".idem-new-live"}, leftovers(t, dir), "the creations removed their own")

	unlock()
	require.NoError(t, openJournal(t, path).Close())
	assert.Empty(t, leftovers(t, dir), "once its creator is gone, its file is removed")
}

// A creator waits for the directory's shared lock while another process
// holds it exclusive (a remover, for as long as a few unlinks take), at
// most the busy timeout: past it, the open fails as locked, naming the
// directory, and creates nothing.
func TestSQLiteCreatorWaitsForTheDirectoryAtMostTheBusyTimeout(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	lockDir(t, dir, syscall.LOCK_EX)
	path := filepath.Join(dir, "ops.db")
	j, err := idem.OpenSQLite(path, idem.SQLiteBusyTimeout(100*time.Millisecond))
	if err == nil {
		require.NoError(t, j.Close())
	}
	require.ErrorIs(t, err, idem.ErrJournalLocked)
	assert.Contains(t, err.Error(), dir)
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, des, "nothing was created")
}
