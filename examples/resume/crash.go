package main

// Demo scaffolding: run the application in a child process (this same
// executable, with an environment variable set), relay its output, and kill
// it with SIGKILL.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// Environment of the child process.
const (
	appEnv     = "IDEM_EXAMPLE_RESUME_APP" // "1": run the application, not the demo
	journalEnv = "IDEM_EXAMPLE_RESUME_JOURNAL"
	shopEnv    = "IDEM_EXAMPLE_RESUME_SHOP"
)

// isApplication reports whether this process is the demo's child.
func isApplication() bool { return os.Getenv(appEnv) == "1" }

// applicationMain is the child's main: the application, configured from
// the environment.
func applicationMain(ctx context.Context) error {
	return runApplication(ctx, os.Stdout, os.Getenv(journalEnv), os.Getenv(shopEnv))
}

// application is the running child process.
type application struct {
	cmd     *exec.Cmd
	stderr  bytes.Buffer
	exited  chan struct{} // closed once the process exited and its output was relayed
	waitErr error

	mu    sync.Mutex
	lines []string // what it printed so far

	killOnce sync.Once
	killed   string
}

// startApplication starts this executable again as the application. Its
// output is relayed to out, each line prefixed with "   app | ".
func startApplication(ctx context.Context, out io.Writer, journalPath, shopURL string) (*application, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	a := &application{exited: make(chan struct{})}
	a.cmd = exec.Command(exe)
	a.cmd.Env = append(os.Environ(), appEnv+"=1", journalEnv+"="+journalPath, shopEnv+"="+shopURL)
	a.cmd.Stdout = &lineWriter{out: out, prefix: "   app | ", line: a.saw}
	a.cmd.Stderr = &a.stderr
	if err := a.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		a.waitErr = a.cmd.Wait()
		close(a.exited)
	}()
	return a, nil
}

func (a *application) Pid() int { return a.cmd.Process.Pid }

func (a *application) saw(line string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lines = append(a.lines, line)
}

func (a *application) printed(s string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, l := range a.lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// WaitFor waits until the application has printed a line containing line
// and cond holds. It fails if the application exits first.
func (a *application) WaitFor(ctx context.Context, line string, cond func() bool) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !a.printed(line) || !cond() {
		select {
		case <-tick.C:
		case <-a.exited:
			return fmt.Errorf("the application exited before the crash: %v\n%s", a.waitErr, a.stderr.String())
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Kill kills the application with SIGKILL (on Unix; TerminateProcess on
// Windows), waits for it, and says how it ended.
func (a *application) Kill() string {
	a.killOnce.Do(func() {
		_ = a.cmd.Process.Kill()
		<-a.exited
		a.killed = fmt.Sprintf("The process ended: %v.", a.waitErr)
	})
	return a.killed
}

// lineWriter writes each complete line to out after prefix, and tells line
// about it.
type lineWriter struct {
	out    io.Writer
	prefix string
	line   func(string)
	buf    []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		l := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		fmt.Fprintf(w.out, "%s%s\n", w.prefix, l)
		w.line(l)
	}
}
