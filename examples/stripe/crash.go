package main

// Demo scaffolding: run the application in a child process (this same
// executable, with an environment variable set), relay its output, and kill
// it with SIGKILL.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"

	"github.com/idemkit/idem"
)

// Environment of the child process.
const (
	appEnv     = "IDEM_EXAMPLE_STRIPE_APP" // "1": run the application, not the demo
	journalEnv = "IDEM_EXAMPLE_STRIPE_JOURNAL"
	apiEnv     = "IDEM_EXAMPLE_STRIPE_API"
)

func isApplication() bool { return os.Getenv(appEnv) == "1" }

// applicationMain is the child: it pays invoice-8, and is killed before
// the answer comes.
func applicationMain(ctx context.Context) error {
	j, err := idem.OpenSQLite(os.Getenv(journalEnv))
	if err != nil {
		return err
	}
	defer j.Close()
	c, err := newIdem(j, os.Getenv(apiEnv))
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("paying invoice-8")
	pi, err := pay(ctx, c, os.Getenv(apiEnv), "invoice-8", 3000)
	if err != nil {
		return err
	}
	fmt.Println("paid", pi.ID)
	return nil
}

type application struct {
	cmd      *exec.Cmd
	exited   chan struct{}
	waitErr  error
	killOnce sync.Once
	killed   string
}

// startApplication starts this executable again as the application; its
// output goes to out, each line prefixed with "   app | ".
func startApplication(out io.Writer, journalPath, apiURL string) (*application, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	a := &application{exited: make(chan struct{})}
	a.cmd = exec.Command(exe)
	a.cmd.Env = append(os.Environ(), appEnv+"=1", journalEnv+"="+journalPath, apiEnv+"="+apiURL)
	a.cmd.Stderr = os.Stderr
	stdout, err := a.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := a.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			fmt.Fprintln(out, "   app | "+lines.Text())
		}
		a.waitErr = a.cmd.Wait()
		close(a.exited)
	}()
	return a, nil
}

// Kill kills the application with SIGKILL, waits for it, and says how it
// ended.
func (a *application) Kill() string {
	a.killOnce.Do(func() {
		_ = a.cmd.Process.Kill()
		<-a.exited
		a.killed = fmt.Sprintf("The process ended: %v.", a.waitErr)
	})
	return a.killed
}
