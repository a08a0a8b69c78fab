package browser

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/uitest"
	"github.com/idemkit/idem/postgres"
)

// journalUnderTest is a journal the tests fill and idem ui serves.
type journalUnderTest struct {
	// args name it to idem: --journal, and --schema on PostgreSQL.
	args []string
	// open opens it as another process would; the caller closes it.
	open func(t *testing.T) interface {
		idem.Journal
		Close() error
	}
}

// journalKinds are the kinds of journal every ui test runs on.
var journalKinds = []struct {
	name string
	make func(*testing.T) (journalUnderTest, uitest.Fixture)
}{{"sqlite", sqliteFixture}, {"postgres", postgresFixture}}

// sqliteFixture is the fixture in an SQLite file.
func sqliteFixture(t *testing.T) (journalUnderTest, uitest.Fixture) {
	path := filepath.Join(t.TempDir(), "ops.db")
	f := uitest.Build(t, path)
	return journalUnderTest{args: []string{"--journal", path}, open: func(t *testing.T) interface {
		idem.Journal
		Close() error
	} {
		j, err := idem.OpenSQLite(path, idem.SQLiteMustExist())
		require.NoError(t, err)
		return j
	}}, f
}

// postgresDSN is the server every machine of this project runs;
// IDEM_TEST_POSTGRES names another.
func postgresDSN() string {
	if dsn := os.Getenv("IDEM_TEST_POSTGRES"); dsn != "" {
		return dsn
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// postgresFixture is the fixture in a schema of its own on the PostgreSQL
// server, dropped when the test ends; the test skips, saying why, when
// the server cannot be reached.
func postgresFixture(t *testing.T) (journalUnderTest, uitest.Fixture) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, postgresDSN())
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		t.Skipf("PostgreSQL at %s cannot be reached (%v): the ui tests on a PostgreSQL journal need it", postgresDSN(), err)
	}
	t.Cleanup(pool.Close)
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "idem_browser_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		require.NoError(t, err)
	})
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema))
	require.NoError(t, err)
	f := uitest.Fill(t, j, true)
	require.NoError(t, j.Close())
	open := func(t *testing.T) interface {
		idem.Journal
		Close() error
	} {
		j, err := postgres.OpenJournal(context.Background(), pool, postgres.Schema(schema), postgres.WithoutMigration())
		require.NoError(t, err)
		return j
	}
	return journalUnderTest{args: []string{"--journal", postgresDSN(), "--schema", schema}, open: open}, f
}
