package idem_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func init() { children["hold-write-lock"] = childHoldWriteLock }

// childHoldWriteLock takes the write lock of the SQLite file at
// IDEM_TEST_JOURNAL (BEGIN IMMEDIATE, as another program, an operator's
// sqlite3 shell or a backup tool, may), prints "locked", and holds it
// until its stdin closes.
func childHoldWriteLock() error {
	db, err := sql.Open("sqlite3", "file:"+os.Getenv("IDEM_TEST_JOURNAL"))
	if err != nil {
		return err
	}
	defer db.Close()
	c, err := db.Conn(context.Background())
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		return err
	}
	fmt.Println("locked")
	_, _ = io.Copy(io.Discard, os.Stdin)
	_, err = c.ExecContext(context.Background(), "ROLLBACK")
	return err
}

// Every failure of a journal file is a *FileError naming the path and
// what to do (journal_sqlite.go: "Errors from opening or using a journal
// file"). A journal whose write lock another process holds past the busy
// timeout is one: opening it, a Create and a Do must each fail with a
// *FileError for the journal's path, with a hint, and never as
// ErrNotJournal or ErrJournalCorrupt.
func TestSQLiteJournalLockedByAnotherProcessSaysWhatToDo(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	busy := idem.SQLiteBusyTimeout(200 * time.Millisecond)
	j := openJournal(t, path, busy)
	srv := newHoldServer(t)
	srv.hold.Store(false)
	c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry()})

	cmd := childCommand(t, "hold-write-lock", "IDEM_TEST_JOURNAL="+path)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	require.True(t, lines.Scan())
	require.Equal(t, "locked", lines.Text())

	check := func(what string, err error) {
		t.Helper()
		require.Error(t, err, what)
		assert.False(t, errors.Is(err, idem.ErrNotJournal) || errors.Is(err, idem.ErrJournalCorrupt), "%s: %v", what, err)
		var fe *idem.FileError
		if assert.True(t, errors.As(err, &fe), "%s: a *FileError, got %T: %v", what, err, err) {
			assert.Equal(t, path, fe.Path, what)
			assert.NotEmpty(t, fe.Hint, "%s: the error says what to do: %v", what, err)
		}
	}
	_, err = idem.OpenSQLite(path, busy)
	check("OpenSQLite", err)
	_, _, err = j.Create(context.Background(), testRecord("locked", "op-1", nil))
	check("Create", err)
	_, err = c.Do(context.Background(), idem.Op{ID: "op-2", Method: http.MethodPost, URL: "/orders", Body: []byte(`{}`)})
	check("Do", err)
	assert.Zero(t, srv.log.count(http.MethodPost), "nothing was sent")
}
