package postgres_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgproxy"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// journalBehindAProxiedPooler opens a journal, in a schema of its own,
// on a pool that reaches the database through a proxy in front of
// PgBouncer in transaction mode.
func journalBehindAProxiedPooler(t *testing.T) (*pgproxy.Proxy, *postgres.Journal, string) {
	t.Helper()
	p, pool := poolBehindAProxiedPooler(t)
	schema := pgtest.Schema(t)
	return p, openOn(t, pool, schema, postgres.WithoutLiveness()), schema
}

// poolBehindAProxiedPooler opens a pool that reaches the database through
// a proxy in front of PgBouncer in transaction mode.
func poolBehindAProxiedPooler(t *testing.T) (*pgproxy.Proxy, *pgxpool.Pool) {
	t.Helper()
	bouncer := pgtest.StartBouncer(t)
	cfg, err := pgxpool.ParseConfig(bouncer.DSN())
	require.NoError(t, err)
	p, err := pgproxy.Start(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(p.Addr().Port)
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return p, pool
}

// waitingStatements counts the sessions, but the one of pid, whose
// statement names schema and waits for a lock.
func waitingStatements(t *testing.T, admin *pgxpool.Pool, schema string, pid int32) int {
	t.Helper()
	var n int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE cardinality(pg_blocking_pids(pid)) > 0 AND query LIKE '%' || $1 || '%' AND pid <> $2`,
		schema, pid).Scan(&n))
	return n
}

// TestDoWhoseOutcomeIsInDoubtBehindATransactionPooler: the journal reaches
// the database through PgBouncer in transaction mode (and a proxy in
// front of it, which cuts the connection). The outcome's write without a
// read (one statement, committed at its Sync) waits for the row, which
// another session holds, and the connection to the pooler is cut: the
// write is in doubt. Behind a pooler the journal cannot find the server
// session that runs it (the pooler hands out process numbers of its own),
// so it reads back at once, finds nothing yet, and runs the write again
// through the read, which waits for the row too. Once the other session
// lets go, the first statement, whose Sync the server had, commits; the
// second finds the version taken. The server saw the request once, and
// the journal holds the outcome (succeeded, 201): Do must answer it, as it
// does when the read-back finds the write (or read the record again when
// the write run again is refused). It fails instead, saying the outcome is
// unknown, "journaled as in_flight", the lease "lost to another worker"
// (leased by "" at epoch 1): none of which is so. The package doc of
// settle (indoubt.go) names the refusal as the cost of a pooler; the
// error that reaches the caller misstates the journal.
func TestDoWhoseOutcomeIsInDoubtBehindATransactionPooler(t *testing.T) {
	t.Parallel()
	p, j, schema := journalBehindAProxiedPooler(t)
	admin := pgtest.Pool(t)
	direct := openOn(t, admin, schema, postgres.WithoutLiveness())

	// The server holds the operation's row, and keeps it after answering.
	type hold struct {
		tx  pgx.Tx
		pid int32
	}
	held := make(chan hold, 1)
	hits := new(atomic.Int32)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		hits.Add(1)
		var h hold
		tx, err := admin.Begin(context.Background())
		if err == nil {
			_, err = tx.Exec(context.Background(), `SELECT FROM `+pgx.Identifier{schema, "operations"}.Sanitize()+
				` WHERE op_id = 'order-1' FOR UPDATE`)
		}
		if err == nil {
			err = tx.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&h.pid)
		}
		if err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		h.tx = tx
		held <- h
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, LeaseDuration: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })

	type result struct {
		res *idem.Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := c.Do(ctx, idem.Op{ID: "order-1", Method: http.MethodPost, URL: "/orders", Body: []byte(`{}`)})
		done <- result{res, err}
	}()
	var holder hold
	select {
	case holder = <-held:
	case r := <-done:
		t.Fatalf("Do ended before the server held the row: %v", r.err)
	}
	waitFor := func(n int) {
		for waitingStatements(t, admin, schema, holder.pid) < n {
			select {
			case r := <-done:
				t.Fatalf("Do ended before its outcome waited for the row: %v", r.err)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	waitFor(1) // the outcome's statement
	p.CutAll()
	waitFor(2) // the same write again, through the read
	require.NoError(t, holder.tx.Rollback(ctx))

	r := <-done
	assert.EqualValues(t, 1, hits.Load(), "the request was sent once")
	rec, err := direct.Lookup(ctx, "default", "order-1")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State, "the journal holds the outcome")
	require.NoError(t, r.err, "the journal holds the outcome: Do answers it")
	assert.Equal(t, http.StatusCreated, r.res.StatusCode)
}

// TestDoWhoseIntentIsInDoubtBehindATransactionPooler: as
// TestDoWhoseOutcomeIsInDoubtBehindATransactionPooler, for the intent: its
// create (one statement, committed at its Sync) waits for another
// session's uncommitted row of the same operation when the connection to
// the pooler is cut. The read-back finds nothing yet, the create runs
// again through the read and waits too; the other session rolls back, the
// first create commits. The operation is then this call's, as when the
// read-back finds it: Do must send the request once and answer the 201.
// It sends nothing instead, waits for its own lease (an hour here) until
// its context ends, and says the outcome is unknown and "may have been
// applied" of a request never sent. (Where the pooler's closing of the
// server session aborts the first create, the second creates the
// operation and Do goes right: the race goes that way now and then.)
func TestDoWhoseIntentIsInDoubtBehindATransactionPooler(t *testing.T) {
	t.Parallel()
	p, j, schema := journalBehindAProxiedPooler(t)
	admin := pgtest.Pool(t)
	direct := openOn(t, admin, schema, postgres.WithoutLiveness())
	c, hits := clientOfACountingServer(t, j)

	// Another session's row of the same operation, not committed.
	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	now := itoa(time.Now().UnixMilli())
	_, err = tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "operations"}.Sanitize()+` (key, scope, op_id, method, url,
			body, fingerprint, key_quoted, resends, state, attempts, next_attempt_at, lease_epoch, created_at, updated_at, version)
		VALUES ('other', 'default', 'order-2', 'POST', 'http://x/orders', '\x7b7d', 'fp', false, 0, 1, 0, `+now+`, 0, `+now+`, `+now+`, 1)`)
	require.NoError(t, err)
	var pid int32
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))

	type result struct {
		res *idem.Result
		err error
	}
	done := make(chan result, 1)
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second) // far less than the lease
	defer cancel()
	go func() {
		res, err := c.Do(dctx, idem.Op{ID: "order-2", Method: http.MethodPost, URL: "/orders", Body: []byte(`{}`)})
		done <- result{res, err}
	}()
	waitFor := func(n int) {
		for waitingStatements(t, admin, schema, pid) < n {
			select {
			case r := <-done:
				t.Fatalf("Do ended before its intent waited for the operation: %v", r.err)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	waitFor(1) // the intent's statement
	p.CutAll()
	waitFor(2) // the same create again, through the read
	require.NoError(t, tx.Rollback(ctx))

	r := <-done
	assert.LessOrEqual(t, hits.Load(), int32(1), "the request was sent at most once")
	rec, err := direct.Lookup(ctx, "default", "order-2")
	require.NoError(t, err)
	t.Logf("sent %d times; the journal holds %s, attempts %d, lease %q", hits.Load(), rec.State, rec.Attempts, rec.Lease.Owner)
	require.NoError(t, r.err, "the intent committed: the operation is this call's")
	assert.Equal(t, http.StatusCreated, r.res.StatusCode)
	assert.EqualValues(t, 1, hits.Load())
	assert.Equal(t, idem.StateSucceeded, rec.State, "Do's answer agrees with the journal")
}
