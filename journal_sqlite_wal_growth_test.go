package idem_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func init() { children["wal-writer"] = childWALWriter }

// childWALWriter opens the journal at IDEM_TEST_JOURNAL with a WAL limit
// of 1 MiB, prints "open", waits for a line on stdin, makes IDEM_N
// durable Creates with a 1 KiB body, and prints the largest size its WAL
// had after any of them.
func childWALWriter() error {
	n, err := strconv.Atoi(os.Getenv("IDEM_N"))
	if err != nil {
		return err
	}
	path := os.Getenv("IDEM_TEST_JOURNAL")
	j, err := idem.OpenSQLite(path, idem.SQLiteWALLimit(1<<20))
	if err != nil {
		return err
	}
	defer j.Close()
	fmt.Println("open")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	var most int64
	for i := range n {
		if _, _, err := j.Create(context.Background(), testRecord("wal", strconv.Itoa(i), make([]byte, 1024))); err != nil {
			return err
		}
		if fi, err := os.Stat(path + "-wal"); err == nil {
			most = max(most, fi.Size())
		}
	}
	fmt.Println(most)
	return nil
}

// The journal keeps its WAL bounded under constant reads (SQLiteJournal's
// documentation; SQLiteWALLimit: "truncates the WAL, waiting for readers
// if it must"). Here the reads come from another process: an operator's
// tool (SQLiteReadOnly) asking Count again and again from two goroutines,
// while the application makes 8,000 durable Creates with a WAL limit of
// 1 MiB. SQLite's own checkpoints let the WAL reach about 4 MB before it
// starts over; it must stay within 16 MiB.
func TestSQLiteWALStaysBoundedUnderAnotherProcessesConstantReads(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	openJournal(t, path).Close()
	cmd := childCommand(t, "wal-writer", "IDEM_TEST_JOURNAL="+path, "IDEM_N=8000")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	require.True(t, lines.Scan())
	require.Equal(t, "open", lines.Text())

	reader := openJournal(t, path, idem.SQLiteReadOnly())
	var stop atomic.Bool
	var reads atomic.Int64
	var wg sync.WaitGroup
	for range 2 { // so that a read is under way whenever one ends
		wg.Go(func() {
			for !stop.Load() {
				if _, err := reader.Count(context.Background()); err != nil {
					t.Errorf("Count: %v", err)
					return
				}
				reads.Add(1)
			}
		})
	}
	_, err = fmt.Fprintln(stdin, "go")
	require.NoError(t, err)
	require.True(t, lines.Scan(), "the writer reports its WAL's largest size")
	most, err := strconv.ParseInt(lines.Text(), 10, 64)
	require.NoError(t, err)
	stop.Store(true)
	wg.Wait()
	require.NoError(t, cmd.Wait())
	assert.LessOrEqual(t, most, int64(16<<20),
		"the WAL grew to %d MiB over 8,000 Creates with a limit of 1 MiB, while another process read the journal (%d reads)",
		most>>20, reads.Load())
}
