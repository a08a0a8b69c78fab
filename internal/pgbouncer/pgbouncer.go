// Package pgbouncer starts a PgBouncer of a test's own in front of a
// PostgreSQL server, for the tests of every module of the repository
// that meet a transaction pooler: the postgres module's (through its
// pgtest package) and the idem command's.
package pgbouncer

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Bouncer is a PgBouncer of a test's own, in front of a server, in
// transaction pooling mode: the pooler that gives a server
// session to a client for one transaction only, as a fleet behind one
// meets it. The test's cleanup stops it by its PID.
type Bouncer struct {
	t    testing.TB
	dir  string
	port int
	db   string
	user string
	exe  string
	cred *syscall.Credential // the user it runs as; nil: this process's
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd.Wait returned
}

// bouncerPoolSize is the most server sessions a Bouncer opens
// (default_pool_size): fewer than the clients of a test, so that they
// share them, and few of the shared server's connections.
const bouncerPoolSize = 2

// Start starts a PgBouncer in front of the server of upstream, a
// postgres:// URL with trust authentication, and waits until it accepts
// connections; settings of the [pgbouncer] section ("pool_mode =
// statement", say) replace the defaults. A test is skipped, saying what to
// install, only where the pgbouncer program is absent (.ci/run installs
// it).
func Start(t testing.TB, upstream string, settings ...string) *Bouncer {
	t.Helper()
	exe, err := exec.LookPath("pgbouncer")
	if err != nil {
		exe = "/usr/sbin/pgbouncer" // Debian's package, off the PATH of a non-root user
		if _, err := os.Stat(exe); err != nil {
			t.Skip("pgbouncer is not installed (apt-get install -y pgbouncer): this test runs the journal behind a real transaction pooler")
		}
	}
	up, err := parseUpstream(upstream)
	if err != nil {
		t.Fatalf("pgbouncer: the upstream server %q: %v", upstream, err)
	}
	dir, err := os.MkdirTemp("", "idem-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	b := &Bouncer{t: t, dir: dir, port: freePort(t), db: up.Database, user: up.User, exe: exe}
	users := fmt.Sprintf("%q \"\"\n", up.User)
	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%d dbname=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
admin_users = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 500
ignore_startup_parameters = extra_float_digits
logfile = %s
%s
`, up.Database, up.Host, up.Port, up.Database, b.port, filepath.Join(dir, "userlist.txt"), up.User, bouncerPoolSize, filepath.Join(dir, "log"), strings.Join(settings, "\n"))
	for name, text := range map[string]string{"userlist.txt": users, "pgbouncer.ini": ini} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root: run it as the postgres user.
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgbouncer: running as root, PgBouncer needs a user of its own to run as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, p := range []string{dir, filepath.Join(dir, "userlist.txt"), filepath.Join(dir, "pgbouncer.ini")} {
			if err := os.Chown(p, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
		b.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	t.Cleanup(b.stop)
	b.start()
	return b
}

// start starts the bouncer and waits until it accepts connections.
func (b *Bouncer) start() {
	b.t.Helper()
	b.cmd = exec.Command(b.exe, filepath.Join(b.dir, "pgbouncer.ini"))
	b.cmd.Dir = b.dir
	// Pdeathsig: a test binary that dies without its cleanups (a panic, a
	// -timeout) leaves no pooler running on the shared machine.
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred, Pdeathsig: syscall.SIGTERM}
	b.done = make(chan struct{})
	if err := b.cmd.Start(); err != nil {
		b.t.Fatalf("pgbouncer: starting pgbouncer: %v", err)
	}
	cmd, done := b.cmd, b.done
	go func() { _ = cmd.Wait(); close(done) }()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", b.port))
		if err == nil {
			_ = c.Close()
			return
		}
		select {
		case <-done:
			b.t.Fatalf("pgbouncer: pgbouncer exited at start:\n%s", b.Log())
		default:
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("pgbouncer: pgbouncer does not listen after a minute:\n%s", b.Log())
		}
	}
}

// Restart stops the bouncer and starts it again on the same port, as an
// operator's restart of the pooler would: every client connection and
// every server session it held ends.
func (b *Bouncer) Restart() {
	b.t.Helper()
	b.stop()
	b.start()
}

// DSN is the upstream's database through the bouncer. pgx's queries run as
// unnamed statements (default_query_exec_mode=exec): a PgBouncer before
// 1.21 keeps no prepared statement from one transaction to the next.
func (b *Bouncer) DSN() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable&default_query_exec_mode=exec", b.user, b.port, b.db)
}

// Log is the bouncer's log so far.
func (b *Bouncer) Log() string {
	out, _ := os.ReadFile(filepath.Join(b.dir, "log"))
	return string(out)
}

// stop ends the bouncer by its PID (SIGTERM: at once, whatever its clients
// do) and waits for it to exit.
func (b *Bouncer) stop() {
	if b.cmd == nil || b.cmd.Process == nil {
		return // never started
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(30 * time.Second):
		if err := b.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			b.t.Logf("pgbouncer: killing pgbouncer: %v", err)
		}
		<-b.done
	}
	if b.t.Failed() {
		b.t.Logf("pgbouncer: pgbouncer log:\n%s", b.Log())
	}
}

// upstream is where a bouncer's one database is.
type upstream struct {
	Host, Database, User string
	Port                 int
}

// parseUpstream reads a postgres:// URL's host, port, database and user,
// with libpq's defaults for those it leaves out.
func parseUpstream(dsn string) (upstream, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return upstream{}, err
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return upstream{}, errors.New("not a postgres:// URL; name the server as one")
	}
	up := upstream{Host: u.Hostname(), Port: 5432, Database: strings.TrimPrefix(u.Path, "/"), User: u.User.Username()}
	if p := u.Port(); p != "" {
		if up.Port, err = strconv.Atoi(p); err != nil {
			return upstream{}, fmt.Errorf("port %q: %w", p, err)
		}
	}
	if up.Host == "" {
		up.Host = "127.0.0.1"
	}
	if up.User == "" {
		cur, err := user.Current()
		if err != nil {
			return upstream{}, fmt.Errorf("no user in the URL, and the current one is unknown: %w", err)
		}
		up.User = cur.Username
	}
	if up.Database == "" {
		up.Database = up.User
	}
	return up, nil
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
