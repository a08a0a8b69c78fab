package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
)

// The PostgreSQL tests use the server every machine of this project runs
// (trust authentication); IDEM_TEST_POSTGRES names another.
const defaultTestDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

func testDSN() string {
	if dsn := os.Getenv("IDEM_TEST_POSTGRES"); dsn != "" {
		return dsn
	}
	return defaultTestDSN
}

// testPassword is put into every DSN the tests give the command: the
// server's trust authentication never asks for it, and no output may
// show it.
const testPassword = "pw-6d1e-SECRET-93c2"

// dsnWithPassword is the test server's DSN with testPassword in it.
func dsnWithPassword(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(testDSN())
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), testPassword)
	return u.String()
}

var (
	pgOnce sync.Once
	pgPool *pgxpool.Pool
	pgErr  error
)

// testPool is the pool the tests share; a test skips, saying why, when
// the server cannot be reached.
func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pgPool, pgErr = pgxpool.New(ctx, testDSN())
		if pgErr == nil {
			pgErr = pgPool.Ping(ctx)
		}
	})
	if pgErr != nil {
		t.Skipf("PostgreSQL at %s cannot be reached (%v): the tests of idem on a PostgreSQL journal need it; "+
			"start it or set IDEM_TEST_POSTGRES", testDSN(), pgErr)
	}
	return pgPool
}

// testSchema names a new schema for one test, dropped when it ends.
func testSchema(t *testing.T) string {
	t.Helper()
	p := testPool(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "idem_cli_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := p.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE")
		assert.NoError(t, err)
	})
	return name
}

// pgJournal creates a journal in a schema of its own, as an application
// does; the test closes it when it ends.
func pgJournal(t *testing.T) (string, *postgres.Journal) {
	t.Helper()
	schema := testSchema(t)
	j, err := postgres.OpenJournal(context.Background(), testPool(t), postgres.Schema(schema))
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	return schema, j
}

// standardPGJournal journals the standard operations (one in each state,
// in two scopes) in a PostgreSQL journal.
func standardPGJournal(t *testing.T) (string, map[string]idem.Record) {
	t.Helper()
	schema, j := pgJournal(t)
	return schema, standardRecords(t, j, nil)
}

// idemOnPG runs the binary on the journal in schema, the DSN carrying a
// password, and checks that no output shows it.
func idemOnPG(t *testing.T, schema string, args ...string) result {
	t.Helper()
	r := cli(t, "", nil, append([]string{"--journal", dsnWithPassword(t), "--schema", schema}, args...)...)
	requireNoPassword(t, r, args)
	return r
}

func requireNoPassword(t *testing.T, r result, args []string) {
	t.Helper()
	require.NotContains(t, r.stdout, testPassword, "idem %v printed the password", args)
	require.NotContains(t, r.stderr, testPassword, "idem %v printed the password", args)
}

// pgSnapshot is everything a PostgreSQL journal holds.
func pgSnapshot(t *testing.T, schema string) snapshot {
	t.Helper()
	ctx := context.Background()
	j, err := postgres.OpenJournal(ctx, testPool(t), postgres.Schema(schema), postgres.WithoutMigration())
	require.NoError(t, err)
	defer j.Close()
	return snapshotOf(t, j)
}

// The read commands on a PostgreSQL journal print what they print on an
// SQLite journal holding the same operations, and change nothing.
func TestPostgresReadCommands(t *testing.T) {
	t.Parallel()
	keys := map[string]string{}
	for _, name := range []string{rPending, rInFlight, rUnknown, rSucceeded, rRejected, rExpired, rCanceled, rBinary} {
		keys[name] = newKey()
	}
	schema, pj := pgJournal(t)
	recs := standardRecords(t, pj, keys)
	path, j := openTestJournal(t)
	standardRecords(t, j, keys)
	require.NoError(t, j.Close())
	before := pgSnapshot(t, schema)

	for _, args := range [][]string{
		{"ls", "--json"}, {"ls", "--state", "unknown,expired", "--json"}, {"ls", "--scope", "tenant-b", "--json"},
		{"show", recs[rUnknown].Key, "--json"}, {"show", "tenant-b/upload/u-1", "--json", "--body"},
	} {
		pg := idemOnPG(t, schema, args...)
		requireOK(t, pg)
		lite := idemOn(t, path, args...)
		requireOK(t, lite)
		assert.Equal(t, withoutTimes(t, lite.stdout), withoutTimes(t, pg.stdout), "idem %v", args)
	}
	r := idemOnPG(t, schema, "ls")
	requireOK(t, r)
	assert.Contains(t, r.stdout, recs[rUnknown].Key)
	assert.Contains(t, r.stdout, "KEY ")
	r = idemOnPG(t, schema, "show", recs[rSucceeded].Key)
	requireOK(t, r)
	assert.Contains(t, r.stdout, "response: 201 Created (replayed by the server)")

	r = idemOnPG(t, schema, "stats")
	requireOK(t, r)
	assert.Regexp(t, `(?m)^journal +postgres://postgres@127\.0\.0\.1:5432/test\?sslmode=disable \(schema "`+schema+`"\)$`, r.stdout)
	assert.Regexp(t, `(?m)^operations +8$`, r.stdout)
	assert.Contains(t, r.stdout, "the schema's tables")
	r = idemOnPG(t, schema, "stats", "--json")
	requireOK(t, r)
	assert.Contains(t, r.stdout, `"total":8`)

	// $IDEM_JOURNAL names it too.
	r = cli(t, "", []string{"IDEM_JOURNAL=" + dsnWithPassword(t)}, "ls", "--schema", schema, "--json")
	requireOK(t, r)
	requireNoPassword(t, r, []string{"ls"})
	assert.Len(t, jsonLines(t, r.stdout), 8)

	// Not found: the message names the journal, without the password.
	r = idemOnPG(t, schema, "show", "no-such-key")
	requireOneLineError(t, r, exitError, `no operation has key "no-such-key" in journal postgres://postgres@127.0.0.1:5432/test`)
	assert.Equal(t, before, pgSnapshot(t, schema))
}

// withoutTimes parses JSON lines and drops what differs between two
// journals written at different moments: times, ages, the lease's.
func withoutTimes(t *testing.T, out string) []map[string]any {
	t.Helper()
	objs := jsonLines(t, out)
	var strip func(v any)
	strip = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if strings.HasSuffix(k, "_at") || k == "at" || strings.HasPrefix(k, "age") || k == "expires" {
					delete(x, k)
					continue
				}
				strip(e)
			}
		case []any:
			for _, e := range x {
				strip(e)
			}
		}
	}
	for _, o := range objs {
		strip(o)
	}
	return objs
}

// Writes on a PostgreSQL journal: reconcile, cancel and prune, with the
// rules and messages they have on SQLite.
func TestPostgresWriteCommands(t *testing.T) {
	t.Parallel()
	schema, recs := standardPGJournal(t)

	unknown := recs[rUnknown]
	r := idemOnPG(t, schema, "reconcile", unknown.Key, "--as", "succeeded", "--note", "matched order 9812 in the ERP")
	requireOK(t, r)
	assert.Equal(t, "reconciled "+unknown.Key+" (default/"+longID+") as succeeded, was unknown\n", r.stdout)
	r = idemOnPG(t, schema, "reconcile", "--as", "rejected", "--note", "no shipment found", "tenant-b/ship/s-9")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "as rejected, was expired")
	r = idemOnPG(t, schema, "show", recs[rExpired].Key)
	requireOK(t, r)
	assert.Regexp(t, `(?m)^  4 +\S+ \S+ +operator +expired → rejected +1 +- +- +reconciled as rejected; no shipment found$`, r.stdout)

	r = idemOnPG(t, schema, "cancel", "default/checkout/cart-42")
	requireOK(t, r)
	assert.Equal(t, "canceled "+recs[rPending].Key+" (default/checkout/cart-42)\n", r.stdout)
	before := pgSnapshot(t, schema)
	r = idemOnPG(t, schema, "cancel", recs[rPending].Key)
	requireOneLineError(t, r, exitError, "illegal state transition")
	r = idemOnPG(t, schema, "reconcile", recs[rSucceeded].Key, "--as", "rejected", "--note", "n")
	requireOneLineError(t, r, exitError, "")
	assert.Equal(t, before, pgSnapshot(t, schema), "a refused change changes nothing")

	// Settled ones are pruned; expired and unsettled ones are kept.
	r = idemOnPG(t, schema, "prune", "--older-than", "0s", "--dry-run")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "would prune 7 operation(s)")
	assert.Equal(t, before, pgSnapshot(t, schema))
	r = idemOnPG(t, schema, "prune", "--older-than", "0s")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "pruned 7 operation(s)")
	r = idemOnPG(t, schema, "ls", "--json")
	requireOK(t, r)
	assert.ElementsMatch(t, []string{recs[rInFlight].Key}, keysOf(jsonLines(t, r.stdout)))
}

// A reconcile is fenced as the journal fences it: an operation whose lease
// a live worker holds is refused.
func TestPostgresSettleRefusesALeasedOperation(t *testing.T) {
	t.Parallel()
	schema, j := pgJournal(t)
	ctx := context.Background()
	rec := put(t, j, op{id: "pay/invoice-7", path: []idem.State{idem.StateInFlight, idem.StateUnknown}})
	unregister, err := j.Register(ctx, "worker-a")
	require.NoError(t, err)
	defer unregister()
	_, err = j.Acquire(ctx, rec.Key, "worker-a", time.Hour)
	require.NoError(t, err)
	before := pgSnapshot(t, schema)
	r := idemOnPG(t, schema, "reconcile", rec.Key, "--as", "succeeded", "--note", "matched")
	requireOneLineError(t, r, exitError, "worker-a")
	assert.Equal(t, before, pgSnapshot(t, schema))
}

// A worker that died holding an operation's lease does not block its
// reconcile until the lease lapses: the journal sees the owner gone, as
// its Claim does, and lets the operator's write through; the refusal
// while the owner lives says whom it waits for and until when.
func TestPostgresReconcileOfAGoneWorkersOperation(t *testing.T) {
	t.Parallel()
	schema, j := pgJournal(t)
	ctx := context.Background()
	rec := put(t, j, op{id: "pay/invoice-8", path: []idem.State{idem.StateInFlight, idem.StateUnknown}})
	leave, err := j.Register(ctx, "worker-dead")
	require.NoError(t, err)
	leased, err := j.Acquire(ctx, rec.Key, "worker-dead", time.Hour)
	require.NoError(t, err)

	// Alive: refused, naming the worker and the lease's end.
	r := idemOnPG(t, schema, "reconcile", rec.Key, "--as", "succeeded", "--note", "matched order 9813")
	requireOneLineError(t, r, exitError, "being driven by worker-dead until "+leased.Lease.ExpiresAt.UTC().Format(time.RFC3339))

	// Gone, its lease an hour from lapsing: reconciled now.
	require.NoError(t, leave())
	r = idemOnPG(t, schema, "reconcile", rec.Key, "--as", "succeeded", "--note", "matched order 9813")
	requireOK(t, r)
	assert.Equal(t, "reconciled "+rec.Key+" (default/pay/invoice-8) as succeeded, was unknown\n", r.stdout)
	got, err := j.Get(ctx, rec.Key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, got.State)
	assert.Equal(t, "matched order 9813", got.Note)
}

// Bad input: one line on stderr, exit 1, and nothing created on the
// server: no schema, no table, no row.
func TestPostgresBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := testPool(t)
	missing := testSchema(t) // never created
	foreign := testSchema(t)
	_, err := p.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{foreign}.Sanitize()+
		"; CREATE TABLE "+pgx.Identifier{foreign, "operations"}.Sanitize()+" (id int)")
	require.NoError(t, err)
	newer, _ := pgJournal(t)
	_, err = p.Exec(ctx, "UPDATE "+pgx.Identifier{newer, "idem_schema"}.Sanitize()+" SET version = 99 WHERE kind = 'journal'")
	require.NoError(t, err)

	objects := func() []string {
		rows, err := p.Query(ctx, `SELECT n.nspname || '.' || coalesce(c.relname, '') FROM pg_namespace n
			LEFT JOIN pg_class c ON c.relnamespace = n.oid WHERE n.nspname IN ($1, $2, $3) ORDER BY 1`, missing, foreign, newer)
		require.NoError(t, err)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return names
	}
	before := objects()

	u, err := url.Parse(dsnWithPassword(t))
	require.NoError(t, err)
	badPort := *u
	badPort.Host = "127.0.0.1:1" // nothing listens there
	commands := [][]string{{"ls"}, {"show", "k"}, {"stats"}, {"reconcile", "k", "--as", "succeeded", "--note", "n"},
		{"cancel", "k"}, {"prune", "--older-than", "1d"}, {"migrate"}, {"ui"},
		{"resume", "--base-url", "http://127.0.0.1:1", "--replay"}}
	for _, tc := range []struct {
		name, dsn, schema, want string
	}{
		{"malformed DSN", "postgres://postgres:" + testPassword + "@127.0.0.1:notaport/test", "idem", "not a PostgreSQL URL"},
		{"unreachable server", badPort.String(), "idem", "cannot connect"},
		{"missing schema", u.String(), missing, "no idem journal in schema"},
		{"another program's tables", u.String(), foreign, "exists without idem's version"},
		{"a newer journal", u.String(), newer, "newer than this build"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, args := range commands {
				r := cli(t, "", nil, append([]string{"--journal", tc.dsn, "--schema", tc.schema}, args...)...)
				requireNoPassword(t, r, args)
				requireOneLineError(t, r, exitError, tc.want)
			}
			assert.Equal(t, before, objects(), "nothing was created")
		})
	}
	r := cli(t, "", nil, "--journal", u.String(), "--password-env", "IDEM_NO_SUCH_VAR", "ls")
	requireOneLineError(t, r, exitError, "environment variable IDEM_NO_SUCH_VAR is unset or empty")
	r = cli(t, "", nil, "--journal", "ops.db", "--schema", "x", "ls")
	requireOneLineError(t, r, exitUsage, "--schema names a schema of a PostgreSQL journal")
}

// The password can come from an environment variable --password-env
// names, and from $PGPASSWORD; neither is ever printed.
func TestPostgresPasswordFromTheEnvironment(t *testing.T) {
	t.Parallel()
	schema, _ := standardPGJournal(t)
	for _, env := range [][]string{
		{"IDEM_PG_PASSWORD=" + testPassword},
		{"PGPASSWORD=" + testPassword},
	} {
		args := []string{"--journal", testDSN(), "--schema", schema, "ls", "--json"}
		if strings.HasPrefix(env[0], "IDEM_PG_PASSWORD=") {
			args = append(args, "--password-env", "IDEM_PG_PASSWORD")
		}
		r := cli(t, "", env, args...)
		requireOK(t, r)
		requireNoPassword(t, r, args)
		assert.Len(t, jsonLines(t, r.stdout), 8)
	}
	// A failure with it: the password is in no message.
	r := cli(t, "", []string{"IDEM_PG_PASSWORD=" + testPassword}, "--journal", "postgres://postgres@127.0.0.1:1/test",
		"--password-env", "IDEM_PG_PASSWORD", "ls")
	requireOneLineError(t, r, exitError, "cannot connect")
	requireNoPassword(t, r, nil)
}

// The read commands change nothing on a PostgreSQL journal of an older
// version: they refuse it, naming idem migrate. (The journal is made to
// look older by its version row: migrate itself is the postgres module's
// MigrateJournal, tested there.)
func TestPostgresReadCommandsDoNotMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := testPool(t)
	schema, j := pgJournal(t)
	put(t, j, op{id: "checkout/cart-1"})
	require.NoError(t, j.Close())
	// Pretend it is one version older.
	_, err := p.Exec(ctx, "UPDATE "+pgx.Identifier{schema, "idem_schema"}.Sanitize()+" SET version = version - 1 WHERE kind = 'journal'")
	require.NoError(t, err)
	version := func() int {
		var v int
		require.NoError(t, p.QueryRow(ctx, "SELECT version FROM "+pgx.Identifier{schema, "idem_schema"}.Sanitize()+" WHERE kind = 'journal'").Scan(&v))
		return v
	}
	old := version()
	for _, args := range append(readCommands, []string{"show", "default/checkout/cart-1"}, []string{"ui"}) {
		r := idemOnPG(t, schema, args...)
		requireOneLineError(t, r, exitError, "migrate' first")
		assert.Equal(t, old, version(), "idem %v migrated it", args)
	}
	// Put back as it was: a current journal is left as it is by migrate.
	_, err = p.Exec(ctx, "UPDATE "+pgx.Identifier{schema, "idem_schema"}.Sanitize()+" SET version = version + 1 WHERE kind = 'journal'")
	require.NoError(t, err)
	r := idemOnPG(t, schema, "migrate")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "is already at this build's schema: nothing to do")
	assert.Equal(t, old+1, version())
	r = idemOnPG(t, schema, "ls", "--json")
	requireOK(t, r)
	assert.Len(t, jsonLines(t, r.stdout), 1)
}

// "idem ui" serves a PostgreSQL journal: the overview (with the fleet's
// workers), the list and an operation's page, without the password
// anywhere.
func TestPostgresUI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, j := pgJournal(t)
	recs := standardRecords(t, j, nil)
	leave, err := j.Register(ctx, "worker-7")
	require.NoError(t, err)
	defer leave()
	_, err = j.Acquire(ctx, recs[rInFlight].Key, "worker-7", time.Hour)
	require.NoError(t, err)
	p := startUI(t, nil, "--journal", dsnWithPassword(t), "--schema", schema, "--allow-writes")
	assert.NotContains(t, p.first, testPassword)
	assert.Contains(t, p.first, "postgres://postgres@127.0.0.1:5432/test")
	for _, page := range []string{"", "ops", "ops?state=unknown", "op?key=" + recs[rUnknown].Key, "op?key=no-such-key", "live/overview"} {
		code, body := httpGet(t, p.url+page, nil)
		assert.Contains(t, []int{http.StatusOK, http.StatusNotFound}, code, page)
		assert.NotContains(t, body, testPassword, page)
	}
	_, body := httpGet(t, p.url, nil)
	assert.Regexp(t, `<td>worker-7</td><td class="worker-alive">alive</td><td>1</td>`, body)
	_, body = httpGet(t, p.url+"ops?state=unknown", nil)
	assert.Contains(t, body, recs[rUnknown].Key)
	assert.NotContains(t, body, recs[rPending].Key)
	assert.Equal(t, exitOK, p.stop(t), "stderr: %s", p.stderr)
	assert.NotContains(t, p.stderr.String(), testPassword)
}
