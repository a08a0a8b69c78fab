package idem_test

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// dirFiles maps each file of dir to its contents.
func dirFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	files := map[string]string{}
	for _, de := range des {
		b, err := os.ReadFile(filepath.Join(dir, de.Name()))
		require.NoError(t, err)
		files[de.Name()] = string(b)
	}
	return files
}

// A new journal's file is made in rollback-journal mode before it is
// switched to WAL (since schema 6 its tables too; before, the switch
// alone): a process killed while it creates the journal can leave a hot
// rollback journal (ops.db-journal) beside a half-written file (so at
// 3f24f53 too). SQLiteReadOnly is for "tools that inspect a journal
// without changing it" (idem ls, stats, show, ui): opening such a file
// read-only must leave both files as they are (and refuse it, or read
// it). It rolls the hot journal back instead: the file is truncated
// (36864 bytes to 0 here) and the rollback journal deleted, by a reader.
// The kill lands at a random point: tries until five leave a rollback
// journal with something in it behind (about one in thirty), and skips
// if none does.
func TestSQLiteReadOnlyOpenAfterAKilledCreationChangesNothing(t *testing.T) {
	t.Parallel()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, seed))
	checked := 0
	for i := range 400 {
		dir := t.TempDir()
		path := filepath.Join(dir, "ops.db")
		cmd := childCommand(t, "create-journal", "IDEM_TEST_JOURNAL="+path,
			"IDEM_START="+strconv.FormatInt(time.Now().UnixMilli(), 10))
		cmd.Stderr = nil
		require.NoError(t, cmd.Start())
		time.Sleep(time.Duration(rnd.Int64N(int64(40 * time.Millisecond))))
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if fi, err := os.Stat(path + "-journal"); err != nil || fi.Size() == 0 {
			continue // no rollback journal, or an empty one (SQLite deletes it as it finds it)
		}
		before := dirFiles(t, dir)
		j, err := idem.OpenSQLite(path, idem.SQLiteReadOnly())
		t.Logf("try %d: %d bytes and a %d-byte rollback journal; read-only open: %v",
			i, len(before["ops.db"]), len(before["ops.db-journal"]), err)
		if err == nil {
			require.NoError(t, j.Close())
		}
		after := dirFiles(t, dir)
		if !assert.Equal(t, len(before), len(after), "try %d: the read-only open (%v) left the same files", i, err) {
			return
		}
		for name, b := range before {
			if !assert.Equal(t, len(b), len(after[name]), "try %d: %s's size (read-only open: %v)", i, name, err) ||
				!assert.True(t, b == after[name], "try %d: %s is unchanged (read-only open: %v)", i, name, err) {
				return
			}
		}
		if checked++; checked == 5 {
			return
		}
	}
	if checked == 0 {
		t.Skip("no kill left a rollback journal behind")
	}
}
