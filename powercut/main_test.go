package powercut

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/testserver"
)

// The loops run this test binary again as a child process:
// IDEM_POWERCUT_CHILD names what the child runs instead of the tests.
var children = map[string]func() error{
	"ordersd": func() error {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		return testserver.Daemon(ctx, strings.Fields(os.Getenv("IDEM_POWERCUT_ARGS")), os.Stdout)
	},
	"client": childClient,
}

func TestMain(m *testing.M) {
	if name := os.Getenv("IDEM_POWERCUT_CHILD"); name != "" {
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
	// Every mount's server stops with its unmount: nothing may be left running.
	goleak.VerifyTestMain(m)
}

// childCommand returns a command that runs the child name in a new process
// of binary (this test binary when empty), with env added (ordersd takes
// its flags from IDEM_POWERCUT_ARGS).
func childCommand(binary, name string, env ...string) *exec.Cmd {
	if binary == "" {
		binary = os.Args[0]
	}
	cmd := exec.Command(binary, "-test.run=^$")
	cmd.Env = append(os.Environ(), "IDEM_POWERCUT_CHILD="+name)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	return cmd
}
