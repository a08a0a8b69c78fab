package main

// Demo scaffolding: run each worker as a process of its own (this same
// executable, with environment variables set), relay its output, and kill
// it with SIGKILL.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
)

// Environment of a worker process.
const (
	workerEnv = "IDEM_EXAMPLE_FLEET_WORKER" // the worker's name
	schemaEnv = "IDEM_EXAMPLE_FLEET_SCHEMA"
	shopEnv   = "IDEM_EXAMPLE_FLEET_SHOP"
)

// isWorker reports whether this process is one of the demo's workers.
func isWorker() bool { return os.Getenv(workerEnv) != "" }

// workerMain is a worker's main, configured from the environment.
func workerMain(ctx context.Context) error {
	return runWorker(ctx, os.Stdout, os.Getenv(workerEnv), os.Getenv(schemaEnv), os.Getenv(shopEnv))
}

// worker is a running worker process.
type worker struct {
	name    string
	cmd     *exec.Cmd
	stderr  bytes.Buffer
	exited  chan struct{} // closed once the process exited
	waitErr error

	killOnce sync.Once
	killed   string
}

// startWorker starts this executable again as worker name. Its output is
// relayed to out, each line prefixed with its name.
func startWorker(ctx context.Context, out io.Writer, name, schema, shopURL string) (*worker, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	w := &worker{name: name, exited: make(chan struct{})}
	w.cmd = exec.Command(exe, "-test.run=^$") // a test binary runs no test; a program ignores it
	w.cmd.Env = append(os.Environ(), workerEnv+"="+name, schemaEnv+"="+schema, shopEnv+"="+shopURL)
	w.cmd.Stdout = &prefixWriter{out: out, prefix: fmt.Sprintf("   %s | ", name)}
	w.cmd.Stderr = &w.stderr
	if err := w.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		w.waitErr = w.cmd.Wait()
		close(w.exited)
	}()
	return w, nil
}

// Wait waits for the worker to finish its work and exit.
func (w *worker) Wait(ctx context.Context) error {
	select {
	case <-w.exited:
		if w.waitErr != nil {
			return fmt.Errorf("%s: %v\n%s", w.name, w.waitErr, w.stderr.String())
		}
		return nil
	case <-ctx.Done():
		w.Kill()
		return ctx.Err()
	}
}

// Kill kills the worker with SIGKILL, waits for it, and says how it ended.
func (w *worker) Kill() string {
	w.killOnce.Do(func() {
		_ = w.cmd.Process.Kill()
		<-w.exited
		w.killed = fmt.Sprintf("%s ended: %v.", w.name, w.waitErr)
	})
	return w.killed
}

// syncWriter serializes the writes of the demo and its workers' relays,
// which all go to one writer.
type syncWriter struct {
	mu  sync.Mutex
	out io.Writer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.Write(b)
}

// prefixWriter writes each complete line to out after prefix.
type prefixWriter struct {
	mu     sync.Mutex
	out    io.Writer
	prefix string
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		fmt.Fprintf(p.out, "%s%s\n", p.prefix, p.buf[:i])
		p.buf = p.buf[i+1:]
	}
}
