package idem_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A journal opened with SQLiteReadOnly reads what another process writes,
// refuses every write, and leaves the directory as it found it.
func TestSQLiteReadOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "ops.db")
	w := openJournal(t, path)
	rec := testRecord("default", "a", []byte("x"))
	_, _, err := w.Create(ctx, rec)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	before := files(t, dir)

	r, err := idem.OpenSQLite(path, idem.SQLiteReadOnly())
	require.NoError(t, err)
	got, err := r.Get(ctx, rec.Key)
	require.NoError(t, err)
	assert.Equal(t, "a", got.ID)
	_, _, err = r.Create(ctx, testRecord("default", "b", []byte("y")))
	assert.ErrorIs(t, err, idem.ErrJournalReadOnly)
	_, err = r.Register(ctx, "w1")
	assert.ErrorIs(t, err, idem.ErrJournalReadOnly)
	_, err = r.Prune(ctx, time.Now())
	assert.ErrorIs(t, err, idem.ErrJournalReadOnly)
	_, err = r.Acquire(ctx, rec.Key, "w1", time.Minute)
	assert.ErrorIs(t, err, idem.ErrJournalReadOnly)

	// Another process writes while it is open: it sees the write.
	w = openJournal(t, path)
	_, _, err = w.Create(ctx, testRecord("default", "c", []byte("z")))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	_, err = r.Lookup(ctx, "default", "c")
	assert.NoError(t, err)
	require.NoError(t, r.Close())
	after := files(t, dir)
	assert.ElementsMatch(t, keysOfMap(before), keysOfMap(after), "no file left behind")

	// Nothing is created.
	_, err = idem.OpenSQLite(filepath.Join(dir, "missing.db"), idem.SQLiteReadOnly())
	assert.ErrorIs(t, err, idem.ErrJournalPath)
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.NotContains(t, keysOfMap(files(t, dir)), filepath.Join(dir, "missing.db"))
}

// A schema-1 journal opened read-only is refused, not migrated.
func TestSQLiteReadOnlyRefusesAnOlderSchema(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	b, err := os.ReadFile("testdata/journal-v1.db")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o600))
	_, err = idem.OpenSQLite(path, idem.SQLiteReadOnly())
	require.ErrorIs(t, err, idem.ErrSchemaTooOld)
	assert.Contains(t, err.Error(), "schema version 1")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, b, after, "the file is left as it was")
	assert.Equal(t, 1, userVersion(t, path))
}

func files(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		fi, err := e.Info()
		require.NoError(t, err)
		out[filepath.Join(dir, e.Name())] = fi.Size()
	}
	return out
}

func keysOfMap(m map[string]int64) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// A tool that inspects a journal opens it read-only: it never migrates,
// creates or writes anything, and refuses an older schema.
func ExampleSQLiteReadOnly() {
	j, err := idem.OpenSQLite("ops.db", idem.SQLiteReadOnly())
	switch {
	case errors.Is(err, idem.ErrSchemaTooOld):
		fmt.Println("written by an older idem: open it without SQLiteReadOnly to migrate it")
		return
	case err != nil:
		fmt.Println(err)
		return
	}
	defer j.Close()
	counts, err := j.Count(context.Background())
	fmt.Println(len(counts), err)
}
