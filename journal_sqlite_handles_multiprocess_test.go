package idem_test

import (
	"bufio"
	"context"
	"database/sql"
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

func init() { children["open-handles"] = childOpenHandles }

// childOpenHandles waits for IDEM_START (Unix ms), then opens the journal
// at IDEM_TEST_JOURNAL IDEM_HANDLES times at once, from as many
// goroutines (an application with one client per tenant, each with its
// own handle), and makes 20 Creates through each. It prints "ok ID" for
// each Create that returned nil and "err MESSAGE" for each failure.
func childOpenHandles() error {
	start, err := strconv.ParseInt(os.Getenv("IDEM_START"), 10, 64)
	if err != nil {
		return err
	}
	handles, err := strconv.Atoi(os.Getenv("IDEM_HANDLES"))
	if err != nil {
		return err
	}
	time.Sleep(time.Until(time.UnixMilli(start)))
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	say := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintln(out, strings.ReplaceAll(s, "\n", " "))
	}
	var wg sync.WaitGroup
	for h := range handles {
		wg.Go(func() {
			j, err := idem.OpenSQLite(os.Getenv("IDEM_TEST_JOURNAL"), idem.SQLiteBusyTimeout(2*time.Second))
			if err != nil {
				say("err " + err.Error())
				return
			}
			defer j.Close()
			for i := range 20 {
				id := fmt.Sprintf("%d-%d-%d", os.Getpid(), h, i)
				if _, _, err := j.Create(context.Background(), testRecord("handles", id, nil)); err != nil {
					say("err " + err.Error())
					return
				}
				say("ok " + id)
			}
		})
	}
	wg.Wait()
	return out.Flush()
}

// Processes that each open the same journal more than once (an
// application with a client, and so a journal handle, per tenant; the
// same file opened twice in one process is supported:
// TestReview4KeptWALDescriptorIsTheLiveWAL) start together on a new
// journal: four processes, four handles each, 20 durable Creates per
// handle. Every open and every Create must succeed, as they do with six
// processes of one handle each (TestSQLiteNewJournalCreatedBySixProcessesAtOnce)
// or one process of six handles; every acknowledged Create must be in the
// journal afterwards; and the file must pass SQLite's integrity check.
// Three new journals.
func TestSQLiteJournalOpenedFourTimesByEachOfFourProcessesAtOnce(t *testing.T) {
	t.Parallel()
	const procs, handles = 4, 4
	for round := range 3 {
		path := filepath.Join(t.TempDir(), "ops.db")
		start := "IDEM_START=" + strconv.FormatInt(time.Now().Add(time.Second).UnixMilli(), 10)
		outs := make([]string, procs)
		var wg sync.WaitGroup
		for p := range procs {
			wg.Go(func() {
				b, err := childCommand(t, "open-handles", "IDEM_TEST_JOURNAL="+path, start,
					"IDEM_HANDLES="+strconv.Itoa(handles)).Output()
				assert.NoError(t, err, "round %d, process %d", round, p)
				outs[p] = string(b)
			})
		}
		wg.Wait()

		var acked []string
		var errs []string
		for _, o := range outs {
			for _, line := range strings.Split(strings.TrimSpace(o), "\n") {
				kind, rest, _ := strings.Cut(line, " ")
				switch kind {
				case "ok":
					acked = append(acked, rest)
				case "err":
					errs = append(errs, rest)
				}
			}
		}
		db, err := sql.Open("sqlite3", "file:"+path)
		require.NoError(t, err)
		var integrity string
		require.NoError(t, db.QueryRow("PRAGMA integrity_check").Scan(&integrity))
		var missing []string
		if integrity == "ok" {
			for _, id := range acked {
				var n int
				require.NoError(t, db.QueryRow("SELECT count(*) FROM operations WHERE scope = 'handles' AND op_id = ?", id).Scan(&n))
				if n != 1 {
					missing = append(missing, id)
				}
			}
		}
		require.NoError(t, db.Close())
		if len(errs) > 0 {
			assert.Fail(t, "an open or a Create failed", "round %d: %d failures; the first: %s", round, len(errs), errs[0])
		}
		assert.Equal(t, "ok", integrity, "round %d: the journal is intact", round)
		assert.Empty(t, missing, "round %d: %d of %d acknowledged Creates are not in the journal", round, len(missing), len(acked))
		if t.Failed() {
			return
		}
	}
}
