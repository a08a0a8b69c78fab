package idem_test

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"go.uber.org/goleak"
)

// Crash and multi-process tests run this test binary again as a child
// process: IDEM_TEST_CHILD names the function the child runs instead of the
// tests.
var children = map[string]func() error{}

func TestMain(m *testing.M) {
	if name := os.Getenv("IDEM_TEST_CHILD"); name != "" {
		fn, ok := children[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "unknown child %q\n", name)
			os.Exit(2)
		}
		if err := fn(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// Every goroutine a client or journal starts must be stopped by its
	// Close.
	goleak.VerifyTestMain(m)
}

// childCommand returns a command that runs the child function name in a new
// process of this test binary, with env added to the environment.
func childCommand(t *testing.T, name string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "IDEM_TEST_CHILD="+name)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	return cmd
}
