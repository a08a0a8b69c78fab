package server_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

// A child process of this test binary makes IDEM_SERVER_N claims on the
// SQLite store at IDEM_SERVER_STORE when IDEM_SERVER_CHILD is "claim",
// prints "claimed" and exits without closing the store, as a process
// killed after its last claim.
func init() {
	if os.Getenv("IDEM_SERVER_CHILD") != "claim" {
		return
	}
	if err := claimChild(); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func claimChild() error {
	n, err := strconv.Atoi(os.Getenv("IDEM_SERVER_N"))
	if err != nil {
		return err
	}
	store, err := server.OpenSQLiteStore(os.Getenv("IDEM_SERVER_STORE"))
	if err != nil {
		return err
	}
	now := time.Now()
	for i := range n {
		res, err := store.Claim(context.Background(), server.ClaimRequest{
			Key: "key-" + strconv.Itoa(i), Fingerprint: "fp", Method: "POST", Path: "/orders",
			Now: now, ExpiresAt: now.Add(time.Hour), StaleBefore: now.Add(-time.Minute),
		})
		if err != nil {
			return err
		}
		if !res.Claimed {
			return fmt.Errorf("key-%d was not claimed", i)
		}
	}
	fmt.Println("claimed")
	return nil
}

// claimWALSyncs runs claimChild on the store at path under strace, and
// returns how many fsync or fdatasync calls named the WAL beside real,
// the file SQLite writes.
func claimWALSyncs(t *testing.T, path, real string, n int) int {
	t.Helper()
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Skip("strace is not installed: the WAL's fsyncs cannot be counted")
	}
	if err := exec.Command(strace, "-qq", "-e", "trace=none", "true").Run(); err != nil {
		t.Skipf("strace cannot trace here (ptrace not permitted?): %v", err)
	}
	trace := filepath.Join(t.TempDir(), "trace")
	cmd := exec.Command(strace, "-f", "-qq", "-y", "-e", "trace=fsync,fdatasync", "-o", trace, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "IDEM_SERVER_CHILD=claim", "IDEM_SERVER_STORE="+path, "IDEM_SERVER_N="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	require.NoError(t, err)
	require.Equal(t, "claimed\n", string(out))
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

// A claim returns only once it is on disk (SQLiteStore's documentation):
// a request is never run under a claim a power failure could erase. When
// the store's path is a symbolic link to the file, the WAL SQLite writes
// is the one beside the link's target; n claims through the link must
// fsync that WAL at least n times, as they do through the file's own path
// (checked first, so that the count is known to see the syncs).
func TestSQLiteStoreThroughASymlinkFsyncsEachClaim(t *testing.T) {
	t.Parallel()
	const n = 10
	direct := filepath.Join(t.TempDir(), "keys.db")
	require.GreaterOrEqual(t, claimWALSyncs(t, direct, direct, n), n, "through the file's own path")

	dir := t.TempDir()
	target := filepath.Join(dir, "data", "keys.db")
	require.NoError(t, os.Mkdir(filepath.Dir(target), 0o700))
	s, err := server.OpenSQLiteStore(target)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	link := filepath.Join(dir, "keys.db")
	require.NoError(t, os.Symlink(target, link))
	assert.GreaterOrEqual(t, claimWALSyncs(t, link, target, n), n,
		"%d claims through the link %s: the WAL SQLite wrote (%s-wal) was not fsynced after each", n, link, target)
}
