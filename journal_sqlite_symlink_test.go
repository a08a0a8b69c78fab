package idem_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func init() { children["create-n"] = childCreateN }

// childCreateN opens the journal at IDEM_TEST_JOURNAL, makes IDEM_N durable
// Creates one after another, prints "created" and exits without closing
// the journal, as a process that is killed right after its last intent.
func childCreateN() error {
	n, err := strconv.Atoi(os.Getenv("IDEM_N"))
	if err != nil {
		return err
	}
	j, err := idem.OpenSQLite(os.Getenv("IDEM_TEST_JOURNAL"))
	if err != nil {
		return err
	}
	for i := range n {
		if _, _, err := j.Create(context.Background(), testRecord("sync", strconv.Itoa(i), nil)); err != nil {
			return err
		}
	}
	fmt.Println("created")
	os.Exit(0)
	return nil
}

// A journal path may be a symbolic link to the file (a deployment that
// links the data file from a release directory): SQLite follows the link
// and keeps the -wal and -shm beside the file it points to. A link that
// points to a file not yet created is followed too: the journal, its -wal
// and its -shm must still be created 0600, not with the process umask.
func TestSQLiteJournalCreatedThroughADanglingSymlinkIsPrivate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	target := filepath.Join(dir, "data", "ops.db")
	require.NoError(t, os.Mkdir(filepath.Dir(target), 0o700))
	link := filepath.Join(dir, "ops.db")
	require.NoError(t, os.Symlink(target, link))

	j := openJournal(t, link)
	_, _, err := j.Create(context.Background(), testRecord("s", "op-1", []byte("body")))
	require.NoError(t, err)
	for _, p := range []string{target, target + "-wal", target + "-shm"} {
		fi, err := os.Stat(p)
		if !assert.NoError(t, err) {
			continue
		}
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "%s, created through the link %s, must be readable by its owner only", p, link)
	}
}

// walSyncs runs childCreateN on the journal at path under strace, and
// returns how many fsync or fdatasync calls named the WAL beside real,
// the file SQLite writes.
func walSyncs(t *testing.T, path, real string, n int) int {
	t.Helper()
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Skip("strace is not installed: the WAL's fsyncs cannot be counted")
	}
	if err := exec.Command(strace, "-qq", "-e", "trace=none", "true").Run(); err != nil {
		t.Skipf("strace cannot trace here (ptrace not permitted?): %v", err)
	}
	trace := filepath.Join(t.TempDir(), "trace")
	child := childCommand(t, "create-n", "IDEM_TEST_JOURNAL="+path, "IDEM_N="+strconv.Itoa(n))
	cmd := exec.Command(strace, append([]string{"-f", "-qq", "-y", "-e", "trace=fsync,fdatasync", "-o", trace}, child.Args...)...)
	cmd.Env, cmd.Stderr = child.Env, os.Stderr
	out, err := cmd.Output()
	require.NoError(t, err)
	require.Equal(t, "created\n", string(out))
	b, err := os.ReadFile(trace)
	require.NoError(t, err)
	syncs := 0
	lines := bufio.NewScanner(strings.NewReader(string(b)))
	for lines.Scan() {
		if strings.Contains(lines.Text(), real+"-wal>") {
			syncs++
		}
	}
	return syncs
}

// A durable Create returns only once the WAL holding it is fsynced: the
// journal commits at synchronous=NORMAL and fsyncs the WAL itself, by its
// path. When the journal's path is a symbolic link, the WAL SQLite writes
// is the one beside the link's target; n durable Creates through the link
// must fsync that WAL at least n times, as they do through the file's own
// path (checked first, so that the count is known to see the syncs).
func TestSQLiteJournalThroughASymlinkFsyncsItsWAL(t *testing.T) {
	t.Parallel()
	const n = 10
	direct := filepath.Join(t.TempDir(), "ops.db")
	require.GreaterOrEqual(t, walSyncs(t, direct, direct, n), n, "through the file's own path")

	dir := t.TempDir()
	target := filepath.Join(dir, "data", "ops.db")
	require.NoError(t, os.Mkdir(filepath.Dir(target), 0o700))
	openJournal(t, target).Close()
	link := filepath.Join(dir, "ops.db")
	require.NoError(t, os.Symlink(target, link))
	assert.GreaterOrEqual(t, walSyncs(t, link, target, n), n,
		"%d durable Creates through the link %s: the WAL SQLite wrote (%s-wal) was not fsynced after each", n, link, target)
}

// A process killed mid-request loses its lease at once: the next Resume
// on the machine takes its operation over (TestFirstResumeTakesAKilledProcessesOperation).
// The processes sharing a journal may name it by different paths: one by a
// symbolic link, another by the file's own path. The killed process must
// be seen gone all the same.
func TestSQLiteKilledProcessOnASymlinkedJournalIsSeenGone(t *testing.T) {
	t.Parallel()
	srv := newHoldServer(t)
	dir := t.TempDir()
	target := filepath.Join(dir, "data", "ops.db")
	require.NoError(t, os.Mkdir(filepath.Dir(target), 0o700))
	openJournal(t, target).Close()
	link := filepath.Join(dir, "ops.db")
	require.NoError(t, os.Symlink(target, link))

	child := startHoldChild(t, "IDEM_JOURNAL="+link, "IDEM_URL="+srv.URL, "IDEM_OP=charge-1", "IDEM_PATH=/hold")
	srv.waitArrival(t, "/hold")
	j := openJournal(t, target)
	c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry()}) // default LeaseDuration (15 s)
	require.NoError(t, child.Signal(syscall.SIGKILL))
	_, _ = child.Wait()
	srv.hold.Store(false)

	ctx := context.Background()
	rec, err := j.Lookup(ctx, "default", "charge-1")
	require.NoError(t, err)
	rep, err := c.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Claimed, "the process that opened the journal through %s was SIGKILLed, yet a Resume through %s "+
		"did not take its operation: its lease (owner %q) runs until %s; report %+v",
		link, target, rec.Lease.Owner, rec.Lease.ExpiresAt.Format("15:04:05.000"), rep)
}
