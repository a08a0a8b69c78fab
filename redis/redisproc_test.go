package redis_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// redisProc is a redis-server child of the test, on a free port and a
// directory of its own, stopped by PID when the test ends.
type redisProc struct {
	t    testing.TB
	port int
	dir  string
	args []string
	mu   sync.Mutex
	cmd  *exec.Cmd
	out  *bytes.Buffer
	done chan struct{}
}

// startRedis starts redis-server with args added to its port, bind
// address and directory, or skips the test when there is no redis-server.
func startRedis(t testing.TB, args ...string) *redisProc {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed: the test starts Redis servers of its own")
	}
	p := &redisProc{t: t, port: freePort(t), dir: t.TempDir(), args: args}
	p.start()
	t.Cleanup(func() { p.kill() })
	return p
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (p *redisProc) addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

// start runs the server (again, after kill) and waits until it answers.
func (p *redisProc) start() {
	p.t.Helper()
	args := append([]string{"--port", strconv.Itoa(p.port), "--bind", "127.0.0.1", "--dir", p.dir,
		"--daemonize", "no", "--protected-mode", "no"}, p.args...)
	cmd := exec.Command("redis-server", args...)
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("starting redis-server: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.mu.Lock()
	p.cmd, p.out, p.done = cmd, out, done
	p.mu.Unlock()
	c := goredis.NewClient(&goredis.Options{Addr: p.addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		select {
		case <-done:
			p.t.Fatalf("redis-server on port %d exited: %s", p.port, out)
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("redis-server on port %d does not answer: %v", p.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill SIGKILLs the server and waits for it to be gone.
func (p *redisProc) kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

func (p *redisProc) String() string {
	return fmt.Sprintf("redis-server pid %d on %s", p.cmd.Process.Pid, p.addr())
}
