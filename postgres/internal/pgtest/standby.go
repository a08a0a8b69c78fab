package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartStandby makes a streaming replica of s, as an operator would
// (pg_basebackup -R into a directory of its own), starts it on a free
// port, and waits until s streams its WAL to it. name is the standby's
// application_name, the name synchronous_standby_names knows it by. The
// replication is asynchronous until SetSynchronousStandby names it. The
// test's cleanup stops it by its PID.
func (s *Server) StartStandby(name string) *Server {
	s.t.Helper()
	dir, err := os.MkdirTemp("", "idem-pgtest-standby-")
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if s.uid >= 0 {
		if err := os.Chown(dir, s.uid, s.gid); err != nil {
			s.t.Fatal(err)
		}
	}
	sb := &Server{t: s.t, bindir: s.bindir, dir: dir, data: filepath.Join(dir, "data"), port: freePort(s.t), uid: s.uid, gid: s.gid}
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", s.port, name)
	sb.run("pg_basebackup", "-D", sb.data, "-R", "-X", "stream", "-c", "fast", "--no-sync", "-d", conninfo)
	// postgresql.auto.conf is read after postgresql.conf (the primary's,
	// copied), and its last line of a setting wins.
	sb.appendConf("postgresql.auto.conf", fmt.Sprintf("\nport = %d\nprimary_conninfo = '%s'\n", sb.port, conninfo))
	s.t.Cleanup(sb.stop)
	sb.Start()
	s.waitReplication(name, "the standby to stream", `state = 'streaming'`)
	return sb
}

// SetSynchronousStandby makes commits on s wait for the standby named
// name (synchronous_standby_names, reloaded) and waits until s reports it
// synchronous; "" makes the replication asynchronous again.
func (s *Server) SetSynchronousStandby(name string) {
	s.t.Helper()
	if name == "" {
		s.exec(`ALTER SYSTEM RESET synchronous_standby_names`)
	} else {
		s.exec(`ALTER SYSTEM SET synchronous_standby_names = '` + strings.ReplaceAll(name, "'", "''") + `'`)
	}
	s.exec(`SELECT pg_reload_conf()`)
	if name != "" {
		s.waitReplication(name, "the standby to be synchronous", `sync_state = 'sync'`)
	}
}

// WaitReplayed waits until the standby named name has replayed all the
// WAL s has written so far.
func (s *Server) WaitReplayed(name string) {
	s.t.Helper()
	s.waitReplication(name, "the standby to replay the WAL", `replay_lsn >= `+s.queryText(`SELECT quote_literal(pg_current_wal_lsn())`)+`::pg_lsn`)
}

// Detach cuts a standby off from its primary, as a network partition
// between the two would (primary_conninfo emptied, reloaded): it keeps
// what it has received and receives nothing more, and an asynchronous
// primary goes on acknowledging commits that only it has. Detach returns
// once the standby's WAL receiver has stopped.
func (s *Server) Detach() {
	s.t.Helper()
	s.appendConf("postgresql.auto.conf", "\nprimary_conninfo = ''\n")
	s.exec(`SELECT pg_reload_conf()`)
	s.waitFor("the WAL receiver to stop", func(c *pgx.Conn) (bool, error) {
		var n int
		err := c.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_wal_receiver`).Scan(&n)
		return n == 0, err
	})
}

// Promote makes a standby a primary (pg_ctl promote, which waits until it
// accepts writes).
func (s *Server) Promote() {
	s.t.Helper()
	s.run(filepath.Join(s.bindir, "pg_ctl"), "promote", "-w", "-t", "120", "-D", s.data)
}

// Port is the port the server listens on, of 127.0.0.1.
func (s *Server) Port() int { return s.port }

// FailoverDSN is the DSN a fleet that follows a fail-over connects with:
// every server, in order, with target_session_attrs=read-write, so that a
// new connection goes to whichever of them accepts writes (the primary,
// or the standby once promoted), as libpq's and pgx's multi-host
// connection strings do.
func FailoverDSN(servers ...*Server) string {
	hosts := make([]string, len(servers))
	for i, s := range servers {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", s.port)
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/postgres?sslmode=disable&target_session_attrs=read-write"
}

// waitReplication waits until s's pg_stat_replication has a row for the
// standby named name that meets cond.
func (s *Server) waitReplication(name, what, cond string) {
	s.t.Helper()
	s.waitFor(what, func(c *pgx.Conn) (bool, error) {
		var n int
		err := c.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND `+cond, name).Scan(&n)
		return n > 0, err
	})
}

// waitFor polls ok on a session of s until it holds; a minute bounds a
// failing run, it is no measure.
func (s *Server) waitFor(what string, ok func(*pgx.Conn) (bool, error)) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var last error
	for {
		c, err := pgx.Connect(ctx, s.DSN())
		if err == nil {
			var done bool
			done, err = ok(c)
			_ = c.Close(context.Background())
			if err == nil && done {
				return
			}
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			s.t.Fatalf("pgtest: waited a minute for %s (last error: %v)\nserver log:\n%s", what, last, s.Log())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// exec runs a statement on a session of its own.
func (s *Server) exec(sql string) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, s.DSN())
	if err == nil {
		_, err = c.Exec(ctx, sql)
		err = errors.Join(err, c.Close(ctx))
	}
	if err != nil {
		s.t.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// queryText runs a query of one text value on a session of its own.
func (s *Server) queryText(sql string) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out string
	c, err := pgx.Connect(ctx, s.DSN())
	if err == nil {
		err = c.QueryRow(ctx, sql).Scan(&out)
		err = errors.Join(err, c.Close(ctx))
	}
	if err != nil {
		s.t.Fatalf("pgtest: %s: %v", sql, err)
	}
	return out
}

// appendConf appends text to one of the cluster's configuration files.
func (s *Server) appendConf(file, text string) {
	s.t.Helper()
	f, err := os.OpenFile(filepath.Join(s.data, file), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(text)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		s.t.Fatalf("pgtest: configuring the server: %v", err)
	}
}
