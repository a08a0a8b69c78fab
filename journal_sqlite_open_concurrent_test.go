package idem_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func init() {
	children["create-journal"] = childCreateJournal
	children["busy-writer"] = childBusyWriter
}

// childCreateJournal waits for IDEM_START (Unix ms), opens (creating) the
// journal at IDEM_TEST_JOURNAL, creates one operation of its own and
// prints "created".
func childCreateJournal() error {
	start, err := strconv.ParseInt(os.Getenv("IDEM_START"), 10, 64)
	if err != nil {
		return err
	}
	time.Sleep(time.Until(time.UnixMilli(start)))
	j, err := idem.OpenSQLite(os.Getenv("IDEM_TEST_JOURNAL"))
	if err != nil {
		return err
	}
	defer j.Close()
	id := strconv.Itoa(os.Getpid())
	if _, _, err := j.Create(context.Background(), testRecord("create", id, []byte(id))); err != nil {
		return err
	}
	fmt.Println("created")
	return nil
}

// Since schema 6 a new journal's tables are created before the file is
// switched to WAL, in rollback-journal mode, where a reader's lock blocks
// a writer and the switch to WAL needs the file to itself. Six processes
// creating the same new journal at the same instant must all open it, and
// each one's operation must be in it.
func TestSQLiteNewJournalCreatedBySixProcessesAtOnce(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	start := "IDEM_START=" + strconv.FormatInt(time.Now().Add(time.Second).UnixMilli(), 10)
	const n = 6
	outs, errs := make([]string, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			b, err := childCommand(t, "create-journal", "IDEM_TEST_JOURNAL="+path, start).Output()
			outs[i], errs[i] = strings.TrimSpace(string(b)), err
		})
	}
	wg.Wait()
	for i := range n {
		assert.NoError(t, errs[i], "process %d", i)
		assert.Equal(t, "created", outs[i], "process %d", i)
	}
	j := openJournal(t, path)
	got := 0
	for _, err := range j.List(context.Background(), idem.Filter{Scope: "create"}) {
		require.NoError(t, err)
		got++
	}
	assert.Equal(t, n, got)
	assert.Equal(t, 6, userVersion(t, path))
}

// childBusyWriter writes to the journal at IDEM_TEST_JOURNAL back to back,
// one durable create after another, until IDEM_STOP (a file) exists; it
// prints "writing" once it has begun.
func childBusyWriter() error {
	j, err := idem.OpenSQLite(os.Getenv("IDEM_TEST_JOURNAL"))
	if err != nil {
		return err
	}
	defer j.Close()
	ctx := context.Background()
	for i := 0; ; i++ {
		id := strconv.Itoa(os.Getpid()) + "-" + strconv.Itoa(i)
		if _, _, err := j.Create(ctx, testRecord("busy", id, nil)); err != nil {
			return err
		}
		if i == 0 {
			fmt.Println("writing")
		}
		if _, err := os.Stat(os.Getenv("IDEM_STOP")); err == nil {
			return nil
		}
	}
}

// A process opening a schema-5 journal that another process (of this
// build) is writing to back to back must migrate it and open within its
// busy timeout: the migration's BEGIN IMMEDIATE waits for the write lock
// like any other write of the journal (see sqlitefile's begin, which
// polls because SQLite's busy handler, sleeping up to 100 ms between
// tries, lets a busy process starve another). Five opens in a row with a
// busy timeout of two seconds must all succeed.
func TestSQLiteSchema5OpenedWhileAnotherProcessWrites(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "ops.db")
	bigSchema5Journal(t, path, 100)
	// The writer migrates it first; the opens below then only check the
	// version, in the same BEGIN IMMEDIATE.
	stop := filepath.Join(dir, "stop")
	cmd := childCommand(t, "busy-writer", "IDEM_TEST_JOURNAL="+path, "IDEM_STOP="+stop)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	buf := make([]byte, len("writing\n"))
	_, err = out.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "writing\n", string(buf))
	defer func() {
		require.NoError(t, os.WriteFile(stop, nil, 0o600))
		assert.NoError(t, cmd.Wait(), "the writer never failed")
	}()

	for i := range 5 {
		j, err := idem.OpenSQLite(path, idem.SQLiteMustExist(), idem.SQLiteBusyTimeout(2*time.Second))
		if !assert.NoError(t, err, "open %d while another process writes", i) {
			continue
		}
		require.NoError(t, j.Close())
	}
}
