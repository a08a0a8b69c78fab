package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A reading command refuses a schema-5 journal (schema 6 only rebuilt the
// due index, but a reader does not migrate) and names the command to run:
// "idem --journal ops.db migrate", with the path as the operator gave it.
// Run as named, from the same directory, that command must migrate the
// journal and say so. It migrates it (OpenSQLite makes the path absolute),
// then fails reading the version back: sqliteVersion builds
// file://ops.db?mode=ro from a relative path, a URI whose "authority" is
// ops.db, and the command exits 1 with "invalid uri authority".
func TestMigrateOfARelativeJournalPath(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "journal-v5.db"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ops.db"), b, 0o600))

	r := cli(t, dir, nil, "--journal", "ops.db", "ls")
	requireOneLineError(t, r, 1, "idem --journal ops.db migrate")
	assert.Contains(t, r.stderr, "schema version 5")

	r = cli(t, dir, nil, "--journal", "ops.db", "migrate")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "from schema version 5 to 6")
	r = cli(t, dir, nil, "--journal", "ops.db", "migrate")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "already at schema version 6")
}

// The version is read back from the file named, whatever its path holds:
// characters a URI reserves ('?', '#', '%'), a space, given relative or
// absolute. A URI built unescaped names another file (or none) and the
// second migrate would not find the version the first one wrote.
func TestMigrateOfJournalPathsAURIMustEscape(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "journal-v5.db"))
	require.NoError(t, err)
	for _, name := range []string{"o p.db", "ops?mode=rw.db", "ops#1.db", "ops%41.db", "sub dir/ops%20?#.db"} {
		for _, absolute := range []bool{false, true} {
			dir := t.TempDir()
			path := filepath.Join(dir, name)
			require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
			require.NoError(t, os.WriteFile(path, b, 0o600))
			arg := name
			if absolute {
				arg = path
			}
			r := cli(t, dir, nil, "--journal", arg, "migrate")
			requireOK(t, r)
			assert.Contains(t, r.stdout, "from schema version 5 to 6", "%q", arg)
			r = cli(t, dir, nil, "--journal", arg, "migrate")
			requireOK(t, r)
			assert.Contains(t, r.stdout, "already at schema version 6", "%q", arg)
		}
	}
}
