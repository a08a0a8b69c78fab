// Package child runs an example's application as a process of its own
// (this same executable, with environment variables set), relays its
// output and kills it with SIGKILL: the crash of the examples that show a
// Resume. It uses the standard library only, so that the examples in
// modules of their own import it without new requirements.
package child

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
)

// Process is a running child.
type Process struct {
	cmd      *exec.Cmd
	exited   chan struct{}
	waitErr  error
	killOnce sync.Once
	killed   string
}

// Start starts this executable again with env added to the environment;
// its output goes to out, each line prefixed with "   app | ".
func Start(out io.Writer, env ...string) (*Process, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	p := &Process{exited: make(chan struct{})}
	p.cmd = exec.Command(exe)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = os.Stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			fmt.Fprintln(out, "   app | "+lines.Text())
		}
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// Exited is closed once the child has ended and its output is relayed.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Err is how the child ended; read it once Exited is closed.
func (p *Process) Err() error { return p.waitErr }

// Kill kills the child with SIGKILL, waits for it, and says how it ended.
func (p *Process) Kill() string {
	p.killOnce.Do(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		p.killed = fmt.Sprintf("The process ended: %v.", p.waitErr)
	})
	return p.killed
}
