package storebench_test

import (
	"bytes"
	"net"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// startRedis starts a redis-server child on a free port and a directory
// of the benchmark's own, with args, and returns its address; it is
// SIGKILLed by PID when the benchmark ends.
func startRedis(b *testing.B, args ...string) string {
	b.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		b.Skip("redis-server is not installed: the benchmark starts one of its own")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	_ = l.Close()
	cmd := exec.Command("redis-server", append([]string{"--port", port, "--bind", "127.0.0.1", "--dir", b.TempDir(),
		"--daemonize", "no", "--protected-mode", "no"}, args...)...)
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		b.Fatalf("starting redis-server: %v", err)
	}
	b.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGKILL); _ = cmd.Wait() })
	addr := "127.0.0.1:" + port
	c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(20 * time.Second); ; {
		if err := c.Ping(ctx).Err(); err == nil {
			return addr
		} else if time.Now().After(deadline) {
			b.Fatalf("redis-server on %s does not answer: %v\n%s", addr, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
