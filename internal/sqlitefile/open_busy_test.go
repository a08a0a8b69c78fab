package sqlitefile

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A new file's tables are made in rollback-journal mode, and the switch to
// WAL that follows needs the file to itself. SQLite takes that exclusive
// lock from within the read transaction the switch begins, and does not
// call the busy handler for such an upgrade (two connections doing so
// would deadlock): it fails at once while any other connection reads the
// file, as happens when processes open a new file together. Open must
// wait for the reader like any other wait for the file's lock, not take
// the file for a foreign one.
func TestOpenWaitsForAReaderBeforeSwitchingToWAL(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "t.db")
	const appID = 0x74657374
	raw, err := sql.Open("sqlite3", "file:"+path)
	require.NoError(t, err)
	defer raw.Close()
	raw.SetMaxOpenConns(1)
	ctx := context.Background()
	conn, err := raw.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, testSchema[0]+fmt.Sprintf("; PRAGMA application_id=%d; PRAGMA user_version=1", appID))
	require.NoError(t, err)
	var mode string
	require.NoError(t, conn.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode))
	require.Equal(t, "delete", mode, "the file is still in rollback-journal mode, as a new one is before its switch")

	// A reader holds the file's shared lock for a while.
	_, err = conn.ExecContext(ctx, "BEGIN")
	require.NoError(t, err)
	var n int
	require.NoError(t, conn.QueryRowContext(ctx, "SELECT count(*) FROM kv").Scan(&n))
	released := make(chan struct{})
	go func() {
		time.Sleep(300 * time.Millisecond)
		_, _ = conn.ExecContext(ctx, "COMMIT")
		close(released)
	}()

	db, err := Open(ctx, path, Options{What: "test file", AppID: appID, Migrations: testSchema})
	<-released
	require.NoError(t, err, "Open waits for the reader, within its busy timeout")
	defer db.Close()
	require.NoError(t, db.Write(ctx, Durable, put("k", "v")))
	v, ok := get(t, db, "k")
	assert.True(t, ok)
	assert.Equal(t, "v", v)
}

// A reader that outlasts the busy timeout gets a clear error saying so,
// not one that calls the file foreign.
func TestOpenBlockedByAReaderPastItsBusyTimeoutSaysSo(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "t.db")
	const appID = 0x74657374
	raw, err := sql.Open("sqlite3", "file:"+path)
	require.NoError(t, err)
	defer raw.Close()
	raw.SetMaxOpenConns(1)
	ctx := context.Background()
	conn, err := raw.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, testSchema[0]+fmt.Sprintf("; PRAGMA application_id=%d; PRAGMA user_version=1", appID))
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, "BEGIN")
	require.NoError(t, err)
	var n int
	require.NoError(t, conn.QueryRowContext(ctx, "SELECT count(*) FROM kv").Scan(&n))
	defer conn.ExecContext(ctx, "COMMIT") //nolint:errcheck

	_, err = Open(ctx, path, Options{What: "test file", AppID: appID, Migrations: testSchema, BusyTimeout: 200 * time.Millisecond})
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrForeign)
	assert.ErrorIs(t, err, ErrLocked)
	assert.Contains(t, err.Error(), "another process")
	assert.Contains(t, err.Error(), "200ms")
}

// Six opens of the same new file at once, many times over: each must open
// it. Those that reach the switch to WAL together each hold the shared
// lock when one of them asks for the exclusive one, and SQLite fails the
// others at once (a few rounds in 200 did, before Open retried them).
func TestSixOpensOfANewFileAtOnce(t *testing.T) {
	t.Parallel()
	for round := range 200 {
		path := filepath.Join(t.TempDir(), fmt.Sprintf("t%d.db", round))
		errs := make([]error, 6)
		dbs := make([]*DB, 6)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() {
				<-start
				dbs[i], errs[i] = Open(context.Background(), path, Options{What: "test file", AppID: 0x74657374, Migrations: testSchema})
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if assert.NoError(t, err, "round %d open %d", round, i) {
				require.NoError(t, dbs[i].Close())
			}
		}
	}
}
