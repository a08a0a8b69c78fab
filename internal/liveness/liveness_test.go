package liveness

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// A child process registers the owner named by LIVENESS_CHILD in the
// directory LIVENESS_DIR, says so on stdout, and waits to be killed.
func TestMain(m *testing.M) {
	if owner := os.Getenv("LIVENESS_CHILD"); owner != "" {
		if _, err := New(os.Getenv("LIVENESS_DIR")).Register(owner); err != nil {
			os.Stdout.WriteString("error: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("registered\n")
		select {}
	}
	goleak.VerifyTestMain(m)
}

// startOwner runs a child process that registers owner in dir and returns
// it once the registration is done.
func startOwner(t *testing.T, dir, owner string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "LIVENESS_CHILD="+owner, "LIVENESS_DIR="+dir)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "registered\n", line)
	return cmd
}

func TestAnotherProcessIsAliveUntilKilled(t *testing.T) {
	if !supported {
		t.Skip("no advisory locks on this platform")
	}
	dir := filepath.Join(t.TempDir(), "owners")
	child := startOwner(t, dir, "worker/1")
	d := New(dir)
	require.False(t, d.Gone("worker/1"), "a live process is not gone")
	require.NoError(t, child.Process.Kill()) // SIGKILL: no chance to clean up
	_ = child.Wait()
	require.True(t, d.Gone("worker/1"), "a SIGKILLed process is gone")
	require.True(t, d.Gone("worker/1"), "and stays gone")
}

func TestOwnRegistrationIsAliveUntilReleased(t *testing.T) {
	if !supported {
		t.Skip("no advisory locks on this platform")
	}
	dir := filepath.Join(t.TempDir(), "owners")
	d := New(dir)
	release, err := d.Register("me")
	require.NoError(t, err)
	// Another Dir of the same process (another journal handle) probes
	// through a file of its own: the lock still conflicts.
	other := New(dir)
	require.False(t, other.Gone("me"))
	require.False(t, d.Gone("me"))

	fi, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "the directory is private")

	require.NoError(t, release())
	require.NoError(t, release(), "release twice is harmless")
	require.True(t, d.Gone("me"))
	require.True(t, other.Gone("me"), "a released owner is gone for everyone")

	_, err = d.Register("me")
	require.ErrorIs(t, err, ErrRegistered, "a name is never registered twice")
}

func TestUnknownOwnerIsNotGone(t *testing.T) {
	d := New(filepath.Join(t.TempDir(), "owners"))
	require.False(t, d.Gone("never-registered"), "nothing is known of it: its leases lapse")
	require.False(t, d.Gone(""))
}

func TestRegisteringTheSameNameTwiceIsRefused(t *testing.T) {
	if !supported {
		t.Skip("no advisory locks on this platform")
	}
	dir := filepath.Join(t.TempDir(), "owners")
	startOwner(t, dir, "pod-1")
	_, err := New(dir).Register("pod-1")
	require.ErrorIs(t, err, ErrRegistered)
}

func TestForgetAndSweepRemoveOnlyGoneOwners(t *testing.T) {
	if !supported {
		t.Skip("no advisory locks on this platform")
	}
	dir := filepath.Join(t.TempDir(), "owners")
	alive := startOwner(t, dir, "alive")
	dead := startOwner(t, dir, "dead")
	kept := startOwner(t, dir, "dead-but-referenced")
	_ = alive
	for _, c := range []*exec.Cmd{dead, kept} {
		require.NoError(t, c.Process.Kill())
		_ = c.Wait()
	}
	d := New(dir)
	d.Forget("alive")
	require.FileExists(t, d.fileOf("alive"), "Forget never removes a live owner's file")

	require.NoError(t, d.Sweep(func(owner string) bool { return owner == "dead-but-referenced" }))
	require.NoFileExists(t, d.fileOf("dead"))
	require.FileExists(t, d.fileOf("dead-but-referenced"), "Sweep keeps what the caller still needs")
	require.FileExists(t, d.fileOf("alive"))

	d.Forget("dead-but-referenced")
	require.NoFileExists(t, d.fileOf("dead-but-referenced"))
	require.True(t, d.Gone("dead-but-referenced"), "this Dir remembers what it found")
	require.False(t, New(dir).Gone("dead"), "once forgotten, an owner is unknown to a new Dir")
}
