package idem_test

import (
	"context"
	"database/sql"
	"io"
	"math/rand/v2"
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

// killedMidMigration copies orig (a schema-5 journal in rollback-journal
// mode) to path and has a child process migrate it, killed (SIGKILL)
// after a random delay, until a kill leaves a hot rollback journal behind;
// it reports whether one did within tries.
func killedMidMigration(t *testing.T, rnd *rand.Rand, orig, path string, tries int) bool {
	t.Helper()
	for range tries {
		for _, suffix := range []string{"", "-journal", "-wal", "-shm"} {
			_ = os.Remove(path + suffix)
		}
		copyJournal(t, orig, path)
		cmd := childCommand(t, "open-journal", "IDEM_TEST_JOURNAL="+path)
		cmd.Stdout, cmd.Stderr = io.Discard, nil
		require.NoError(t, cmd.Start())
		time.Sleep(time.Duration(rnd.Int64N(int64(400 * time.Millisecond))))
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if fi, err := os.Stat(path + "-journal"); err == nil && fi.Size() > 0 {
			return true
		}
	}
	return false
}

// A schema-5 journal in rollback-journal mode (TestSQLiteSchema5InRollbackJournalModeMigrates)
// whose migration was killed leaves a hot rollback journal beside a
// half-written file. The application's replicas then restart together:
// six processes opening it at the same instant must each open it (one
// rolls the hot journal back, the others wait for it), and find every
// operation, as six processes creating a new journal at once do
// (TestSQLiteNewJournalCreatedBySixProcessesAtOnce).
func TestSQLiteHotJournalOpenedBySixProcessesAtOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	orig, path := filepath.Join(dir, "v5.db"), filepath.Join(dir, "ops.db")
	const n = 20_000
	bigSchema5Journal(t, orig, n)
	db, err := sql.Open("sqlite3", "file:"+orig)
	require.NoError(t, err)
	var mode string
	require.NoError(t, db.QueryRow("PRAGMA journal_mode=DELETE").Scan(&mode))
	require.Equal(t, "delete", mode)
	require.NoError(t, db.Close())

	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, seed))
	for round := range 2 {
		if !killedMidMigration(t, rnd, orig, path, 30) {
			t.Skip("no kill left a hot rollback journal behind")
		}
		start := "IDEM_START=" + strconv.FormatInt(time.Now().Add(time.Second).UnixMilli(), 10)
		const procs = 6
		outs, errs := make([]string, procs), make([]error, procs)
		var wg sync.WaitGroup
		for i := range procs {
			wg.Go(func() {
				b, err := childCommand(t, "create-journal", "IDEM_TEST_JOURNAL="+path, start).Output()
				outs[i], errs[i] = strings.TrimSpace(string(b)), err
			})
		}
		wg.Wait()
		for i := range procs {
			assert.NoError(t, errs[i], "round %d, process %d", round, i)
			assert.Equal(t, "created", outs[i], "round %d, process %d", round, i)
		}
		j, err := idem.OpenSQLite(path, idem.SQLiteMustExist())
		require.NoError(t, err)
		counts, err := j.Count(context.Background())
		require.NoError(t, err)
		total := 0
		for _, c := range counts {
			if c.Scope != "create" {
				total += c.N
			}
		}
		assert.Equal(t, n, total, "round %d: every operation is still there", round)
		require.NoError(t, j.Close())
		if t.Failed() {
			return
		}
	}
}
