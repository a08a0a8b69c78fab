package postgres_test

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// childEnv names the child a test binary runs instead of its tests: tests
// that need processes to SIGKILL start this same binary with it set.
const childEnv = "IDEM_POSTGRES_TEST_CHILD"

// children are the child processes' mains by name, registered by the test
// files that start them (in an init function).
var children = map[string]func() error{}

// childCommand returns a command that runs child name of this test binary,
// with env added to the environment.
func childCommand(t testing.TB, name string, env ...string) *exec.Cmd {
	t.Helper()
	if children[name] == nil {
		t.Fatalf("no child %q is registered", name)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+name), env...)
	return cmd
}

// Every test must leave no goroutine behind: stores hold none, middlewares
// are closed, test servers and their clients are closed, and the pools a
// test opens are closed with it. pgtest.Main closes the shared pool before
// it looks.
func TestMain(m *testing.M) {
	if name := os.Getenv(childEnv); name != "" {
		main := children[name]
		if main == nil {
			fmt.Fprintf(os.Stderr, "%s=%s: no such child\n", childEnv, name)
			os.Exit(2)
		}
		if err := main(); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	pgtest.Main(m)
}
