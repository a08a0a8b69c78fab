package pgtest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is a PostgreSQL server of a test's own, for a test that crashes
// or restarts it without disturbing the other tests: a cluster made by
// initdb in a temporary directory, listening on a free port of 127.0.0.1
// with trust authentication, run as the postgres user when the test runs
// as root (PostgreSQL refuses to run as root). The test's cleanup stops it
// by its PID and removes the directory.
type Server struct {
	t      testing.TB
	bindir string
	dir    string // owned by the user the server runs as
	data   string
	port   int
	uid    int // of the user the server runs as; -1: this process's
	gid    int
}

// ServersEnv names the environment variable that lets the tests which
// start a PostgreSQL of their own run (StartServer skips them otherwise).
const ServersEnv = "IDEM_PG_SERVERS"

// StartServer makes and starts a server of the test's own, or fails the
// test saying what is missing. It skips the test unless ServersEnv (or
// the fleet soak's IDEM_PG_FLEET_SOAK) is set.
func StartServer(t testing.TB) *Server {
	t.Helper()
	if os.Getenv(ServersEnv) == "" && os.Getenv("IDEM_PG_FLEET_SOAK") == "" {
		// initdb, crashes and promotions take most of a 2-core machine's
		// time for a minute or more: out of the README's test command,
		// in a step of .ci/run of their own, which names each such test:
		// add a new one there.
		t.Skip("starts a PostgreSQL of its own (initdb, crashes, promotions): set " + ServersEnv + "=1 to run it (.ci/run does)")
	}
	s := &Server{t: t, uid: -1, gid: -1}
	s.bindir = bindir()
	if _, err := os.Stat(filepath.Join(s.bindir, "initdb")); err != nil {
		t.Fatalf("pgtest: no initdb in %q (from pg_config --bindir, or the PATH): install PostgreSQL's server programs", s.bindir)
	}
	dir, err := os.MkdirTemp("", "idem-pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	s.dir = dir
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgtest: running as root, PostgreSQL needs a user of its own to run as: %v", err)
		}
		s.uid, _ = strconv.Atoi(u.Uid)
		s.gid, _ = strconv.Atoi(u.Gid)
		if err := os.Chown(dir, s.uid, s.gid); err != nil {
			t.Fatal(err)
		}
	}
	s.data = filepath.Join(dir, "data")
	s.run("initdb", "-D", s.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	s.port = freePort(t)
	conf := fmt.Sprintf("\nport = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n"+
		"max_connections = 60\nshared_buffers = 16MB\n", s.port)
	f, err := os.OpenFile(filepath.Join(s.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		t.Fatalf("pgtest: configuring the server: %v", err)
	}
	t.Cleanup(s.stop)
	s.Start()
	return s
}

// DSN is the server's database "postgres", as the postgres user.
func (s *Server) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Start starts the server and waits until it accepts connections.
func (s *Server) Start() {
	s.t.Helper()
	s.run(filepath.Join(s.bindir, "pg_ctl"), "start", "-w", "-t", "120", "-D", s.data, "-l", filepath.Join(s.dir, "log"))
}

// Crash stops the server at once, as a crash would: every backend ends
// without a word and the next start recovers from the WAL
// (pg_ctl stop -m immediate).
func (s *Server) Crash() {
	s.t.Helper()
	s.run(filepath.Join(s.bindir, "pg_ctl"), "stop", "-m", "immediate", "-w", "-D", s.data)
}

// Stop shuts the server down cleanly (pg_ctl stop -m fast): the backends
// are ended, a shutdown checkpoint written, and the next start recovers
// nothing.
func (s *Server) Stop() {
	s.t.Helper()
	s.run(filepath.Join(s.bindir, "pg_ctl"), "stop", "-m", "fast", "-w", "-D", s.data)
}

// Restart crashes the server and starts it again.
func (s *Server) Restart() {
	s.t.Helper()
	s.Crash()
	s.Start()
}

// Log is the server's log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "log"))
	return string(b)
}

// CrashBackend kills one backend of the server, pid, with SIGKILL, as a
// crash of that process would: the postmaster then ends every other
// backend and reinitialises, recovering from the WAL, without a restart
// (restart_after_crash) and so keeping its start time. The postmaster is
// held (SIGSTOP) for hold before it sees the crash, so that the server
// takes no connection for at least that long, as a long recovery would.
// CrashBackend returns once the server accepts connections again.
func (s *Server) CrashBackend(pid int, hold time.Duration) {
	s.t.Helper()
	postmaster := s.postmasterPID()
	if postmaster <= 0 || pid == postmaster {
		s.t.Fatalf("pgtest: CrashBackend(%d): not a backend of a running server (postmaster %d)", pid, postmaster)
	}
	logged := len(s.Log())
	for _, k := range []struct {
		pid int
		sig syscall.Signal
	}{{postmaster, syscall.SIGSTOP}, {pid, syscall.SIGKILL}} {
		if err := syscall.Kill(k.pid, k.sig); err != nil {
			_ = syscall.Kill(postmaster, syscall.SIGCONT)
			s.t.Fatalf("pgtest: CrashBackend: %v to %d: %v", k.sig, k.pid, err)
		}
	}
	time.Sleep(hold)
	if err := syscall.Kill(postmaster, syscall.SIGCONT); err != nil {
		s.t.Fatalf("pgtest: CrashBackend: SIGCONT to the postmaster %d: %v", postmaster, err)
	}
	// A connection the postmaster takes before it has seen the crash would
	// say nothing of the reinitialisation: wait for its word first.
	for deadline := time.Now().Add(time.Minute); !strings.Contains(s.Log()[logged:], "reinitializing"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			s.t.Fatalf("pgtest: waited a minute for the postmaster to reinitialise\nserver log:\n%s", s.Log())
		}
	}
	s.waitFor("the server to take connections after its reinitialisation", func(*pgx.Conn) (bool, error) { return true, nil })
}

// postmasterPID is the PID in the server's postmaster.pid, or 0 if the
// server is not running.
func (s *Server) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(s.data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// stop ends the server, if it runs, by the PID in its postmaster.pid, and
// waits for it to exit.
func (s *Server) stop() {
	pid := s.postmasterPID()
	if pid <= 0 {
		return // not running
	}
	_ = syscall.Kill(pid, syscall.SIGQUIT) // immediate shutdown: nothing to keep
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	if s.t.Failed() {
		s.t.Logf("pgtest: server log:\n%s", s.Log())
	}
}

// run runs a program as the server's user, failing the test with its
// output if it fails.
func (s *Server) run(name string, args ...string) {
	s.t.Helper()
	if !strings.Contains(name, "/") {
		name = filepath.Join(s.bindir, name)
	}
	cmd := exec.Command(name, args...)
	if s.uid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(s.uid), Gid: uint32(s.gid)}}
	}
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		s.t.Fatalf("pgtest: %s %s: %v\n%s\nserver log:\n%s", filepath.Base(name), strings.Join(args, " "), err, out.String(), s.Log())
	}
}

// bindir is where PostgreSQL's server programs are: pg_config --bindir,
// else the directory of initdb on the PATH.
func bindir() string {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); d != "" {
			if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
				return d
			}
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p)
	}
	return ""
}

// freePort returns a port of 127.0.0.1 that nothing listened on a moment
// ago.
func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
