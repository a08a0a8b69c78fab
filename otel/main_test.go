package otel_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// childEnv names the child a test binary runs instead of its tests: the
// crash test starts this same binary with it set, as a worker to SIGKILL.
const childEnv = "IDEM_OTEL_TEST_CHILD"

// children are the child processes' mains by name, registered by the test
// files that start them (in an init function).
var children = map[string]func() error{}

func TestMain(m *testing.M) {
	if name := os.Getenv(childEnv); name != "" {
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
	// Every goroutine a client, journal or provider starts must be stopped
	// by its Close or Shutdown.
	goleak.VerifyTestMain(m)
}
