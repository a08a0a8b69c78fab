package main

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/pgbouncer"
)

// bouncerDSN starts a PgBouncer in transaction pooling mode in front of
// the tests' server, as the README's fleet has, and returns its URL as an
// operator writes it: with testPassword in it, and without pgx's
// default_query_exec_mode (the bouncer, 1.18 here, keeps no prepared
// statement from one transaction to the next).
func bouncerDSN(t *testing.T) string {
	t.Helper()
	testPool(t) // skips where the server is not there
	b := pgbouncer.Start(t, testDSN())
	u, err := url.Parse(b.DSN())
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), testPassword)
	q := u.Query()
	q.Del("default_query_exec_mode")
	u.RawQuery = q.Encode()
	return u.String()
}

// idemVia runs the binary on the journal in schema through dsn, and
// checks that no output shows the password.
func idemVia(t *testing.T, dsn, schema string, args ...string) result {
	t.Helper()
	r := cli(t, "", nil, append([]string{"--journal", dsn, "--schema", schema}, args...)...)
	requireNoPassword(t, r, args)
	return r
}

// Through a transaction pooler (PgBouncer's pool_mode=transaction, which
// refuses startup parameters it does not know), the read commands, the
// web view and the commands that write work as they do on the server.
func TestPostgresCommandsThroughATransactionPooler(t *testing.T) {
	t.Parallel()
	dsn := bouncerDSN(t)
	schema, recs := standardPGJournal(t)

	// Twice: the second run meets the server sessions the first one used.
	for range 2 {
		r := idemVia(t, dsn, schema, "ls", "--json")
		requireOK(t, r)
		assert.Len(t, jsonLines(t, r.stdout), len(recs))
		r = idemVia(t, dsn, schema, "show", recs[rSucceeded].Key)
		requireOK(t, r)
		assert.Contains(t, r.stdout, "response: 201 Created (replayed by the server)")
		r = idemVia(t, dsn, schema, "stats")
		requireOK(t, r)
		assert.Regexp(t, `(?m)^operations +8$`, r.stdout)
	}

	p := startUI(t, nil, "--journal", dsn, "--schema", schema)
	code, body := httpGet(t, p.url+"ops?state=unknown", nil)
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, recs[rUnknown].Key)
	assert.Equal(t, exitOK, p.stop(t), "stderr: %s", p.stderr)

	r := idemVia(t, dsn, schema, "reconcile", recs[rUnknown].Key, "--as", "succeeded", "--note", "matched in the ERP")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "as succeeded, was unknown")
	r = idemVia(t, dsn, schema, "cancel", recs[rPending].Key)
	requireOK(t, r)
	assert.Contains(t, r.stdout, "canceled "+recs[rPending].Key)
	r = idemVia(t, dsn, schema, "ls", "--state", "succeeded,canceled", "--json")
	requireOK(t, r)
	assert.Subset(t, keysOf(jsonLines(t, r.stdout)), []string{recs[rUnknown].Key, recs[rPending].Key})
}

// A command that only reads cannot write, on the server directly and
// through a transaction pooler alike: the server refuses a write that one
// of its statements would make. Here reading the operations table writes
// a row (a view over it calls a function that inserts), and every read
// command is refused by the server, and writes nothing.
func TestPostgresReadCommandsCannotWrite(t *testing.T) {
	t.Parallel()
	for name, dsn := range map[string]func(t *testing.T) string{"direct": dsnWithPassword, "pooler": bouncerDSN} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dsn := dsn(t)
			schema, recs := standardPGJournal(t)
			ctx := context.Background()
			p := testPool(t)
			s := pgx.Identifier{schema}.Sanitize()
			_, err := p.Exec(ctx, `ALTER TABLE `+s+`.operations RENAME TO operations_rows;
				CREATE TABLE `+s+`.written (n int);
				CREATE FUNCTION `+s+`.note_read() RETURNS boolean LANGUAGE sql VOLATILE AS 'INSERT INTO `+s+`.written VALUES (1); SELECT true';
				CREATE VIEW `+s+`.operations AS SELECT * FROM `+s+`.operations_rows WHERE `+s+`.note_read()`)
			require.NoError(t, err)
			written := func() int {
				var n int
				require.NoError(t, p.QueryRow(ctx, `SELECT count(*) FROM `+s+`.written`).Scan(&n))
				return n
			}

			for _, args := range append(readCommands, []string{"show", recs[rUnknown].Key}) {
				r := idemVia(t, dsn, schema, args...)
				requireOneLineError(t, r, exitError, "read-only transaction")
				assert.Zero(t, written(), "idem %v wrote", args)
			}
			ui := startUI(t, nil, "--journal", dsn, "--schema", schema)
			_, body := httpGet(t, ui.url+"ops", nil)
			assert.Contains(t, body, "read-only transaction")
			assert.Zero(t, written(), "idem ui wrote")
			assert.Equal(t, exitOK, ui.stop(t), "stderr: %s", ui.stderr)

			// The view does write where the transaction may: the refusals
			// above were the server's.
			_, err = p.Exec(ctx, `SELECT count(*) FROM `+s+`.operations`)
			require.NoError(t, err)
			assert.NotZero(t, written(), "the view writes when the transaction may")
		})
	}
}

// A connection the server or its pooler refuses gets one line that says
// what was refused, and advice that follows from it, not the host and
// port, which were right.
func TestPostgresRefusedConnectionSaysWhatWasRefused(t *testing.T) {
	t.Parallel()
	schema, _ := standardPGJournal(t)
	// pgx sends a setting in the URL's query as a startup parameter, which
	// PgBouncer refuses unless told to ignore it.
	r := idemVia(t, bouncerDSN(t)+"&statement_timeout=5000", schema, "ls")
	requireOneLineError(t, r, exitError, "unsupported startup parameter: statement_timeout")
	assert.Contains(t, r.stderr, "ignore_startup_parameters")
	assert.NotContains(t, r.stderr, "check the host")

	u, err := url.Parse(dsnWithPassword(t))
	require.NoError(t, err)
	u.Path = "/no_such_database_of_idem"
	r = idemVia(t, u.String(), schema, "ls")
	requireOneLineError(t, r, exitError, `database "no_such_database_of_idem" does not exist`)
	assert.Contains(t, r.stderr, "check the database")
	assert.NotContains(t, r.stderr, "check the host")

	u.Host, u.Path = "127.0.0.1:1", "/test" // nothing listens there
	r = idemVia(t, u.String(), schema, "ls")
	requireOneLineError(t, r, exitError, "cannot connect")
	assert.Contains(t, r.stderr, "check the host and port")
}
