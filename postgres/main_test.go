package postgres_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/postgres"
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

// childProc is a running child process.
type childProc struct {
	name   string
	cmd    *exec.Cmd
	stderr *syncBuffer
	waited chan struct{} // closed once cmd.Wait returned
	err    error         // cmd.Wait's, once waited is closed
}

// startChild starts child, named name in the test's messages, with its
// stdout going to stdout (nil: discarded). The test's cleanup stops it, if
// the test did not, and shows its stderr when the test failed.
func startChild(t *testing.T, child, name string, stdout io.Writer, env ...string) *childProc {
	t.Helper()
	cmd := childCommand(t, child, env...)
	p := &childProc{name: name, cmd: cmd, stderr: &syncBuffer{}, waited: make(chan struct{})}
	cmd.Stdout = stdout
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.waited)
	}()
	t.Cleanup(func() {
		_ = p.stop()
		if t.Failed() && p.stderr.Len() > 0 {
			t.Logf("%s (pid %d) stderr:\n%s", p.name, p.pid(), p.stderr)
		}
	})
	return p
}

func (p *childProc) pid() int { return p.cmd.Process.Pid }

// kill SIGKILLs the child and waits for it to die.
func (p *childProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.waited
}

// stop asks the child to end (SIGTERM) and waits for it; one that has not
// exited within a bound is SIGKILLed. It returns how it exited.
func (p *childProc) stop() error {
	select {
	case <-p.waited:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.waited:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.waited
	}
	return p.err
}

// The journal a child process opens, named by its parent.
const (
	childSchemaEnv   = "IDEM_CHILD_SCHEMA"
	childLivenessEnv = "IDEM_CHILD_LIVENESS" // "off": WithoutLiveness
)

// childJournalEnv is the environment that makes a child open the journal
// in schema, with liveness or without.
func childJournalEnv(schema string, liveness bool) []string {
	env := []string{childSchemaEnv + "=" + schema}
	if !liveness {
		env = append(env, childLivenessEnv+"=off")
	}
	return env
}

// openChildJournal opens, in a child process, the journal childJournalEnv
// named, on a pool of the child's own, as a worker process would. close
// closes both.
func openChildJournal(ctx context.Context) (j *postgres.Journal, close func(), err error) {
	pool, err := pgxpool.New(ctx, pgtest.DSN())
	if err != nil {
		return nil, nil, err
	}
	opts := []postgres.Option{postgres.Schema(os.Getenv(childSchemaEnv))}
	if os.Getenv(childLivenessEnv) == "off" {
		opts = append(opts, postgres.WithoutLiveness())
	}
	j, err = postgres.OpenJournal(ctx, pool, opts...)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return j, func() { _ = j.Close(); pool.Close() }, nil
}

// syncBuffer is a bytes.Buffer that a child's output goroutine and the
// test may use at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Len()
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
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
