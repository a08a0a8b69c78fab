//go:build linux

package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// openPTY opens a pseudo-terminal pair, or skips the test where there is
// none.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal here: %v", err)
	}
	var unlock int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); errno != 0 {
		m.Close()
		t.Skipf("unlocking the pseudo-terminal: %v", errno)
	}
	var n uint32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); errno != 0 {
		m.Close()
		t.Skipf("naming the pseudo-terminal: %v", errno)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Skipf("opening the pseudo-terminal: %v", err)
	}
	return m, s
}

// On a terminal, resume shows its progress on one line rewritten in place,
// erases it, and prints the summary.
func TestResumeProgressOnTerminal(t *testing.T) {
	t.Parallel()
	api := newAPIServer(t, "X-Api-Token", "tty-secret")
	path, j := openTestJournal(t)
	for i := range 3 {
		put(t, j, op{id: fmt.Sprintf("tty/%d", i), url: api.URL + "/orders", body: []byte(`{}`)})
	}
	require.NoError(t, j.Close())

	master, slave := openPTY(t)
	defer master.Close()
	cmd := exec.Command(idemBin, "--journal", path, "resume", "--base-url", api.URL, "--status-url", api.URL+"/idempotency",
		"--header-env", "X-Api-Token=IDEM_TEST_TTY_TOKEN", "--concurrency", "1")
	cmd.Env = append(childEnv(), "IDEM_TEST_TTY_TOKEN=tty-secret")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = slave, &stderr
	require.NoError(t, cmd.Start())
	slave.Close() // the child holds its own copy
	out := make(chan string)
	go func() {
		var b bytes.Buffer
		_, _ = io.Copy(&b, master) // ends with EIO once the child is gone
		out <- b.String()
	}()
	require.NoError(t, cmd.Wait(), stderr.String())
	screen := <-out

	assert.Empty(t, stderr.String())
	for i := 1; i <= 3; i++ {
		assert.Contains(t, screen, fmt.Sprintf("\rresume: %d of ", i))
	}
	assert.Contains(t, screen, "\rresume: 3 of 3 claimed done: 3 succeeded, 0 rejected")
	// The progress line is erased, then the summary printed on its own.
	i := strings.Index(screen, "resume: claimed 3, succeeded 3, rejected 0, pending 0, unknown 0, expired 0, skipped 0, failed 0")
	require.Positive(t, i, "%q", screen)
	assert.True(t, strings.HasSuffix(strings.TrimRight(screen[:i], "\r"), " "), "%q", screen[:i])
	assert.NotContains(t, screen[i:], "\rresume:")

	snap := takeSnapshot(t, path)
	for _, rec := range snap.Records {
		assert.Equal(t, idem.StateSucceeded, rec.State)
	}
}
