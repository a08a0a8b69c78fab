package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/operator"
	"github.com/idemkit/idem/internal/sqlitefile"
	"github.com/idemkit/idem/postgres"
)

// access is what a command does to the journal.
type access int

const (
	// reading: ls, show, stats, ui without --allow-writes. Nothing is
	// migrated, created or locked for writing, on either kind of journal.
	reading access = iota
	// writing: reconcile, cancel, prune, resume, ui --allow-writes, and
	// migrate.
	writing
)

// openJournal is an open journal of either kind.
type openJournal struct {
	idem.Journal
	// sqlite is the SQLite journal, nil on PostgreSQL; pg and pool the
	// PostgreSQL journal and its pool, nil on SQLite.
	sqlite *idem.SQLiteJournal
	pg     *postgres.Journal
	pool   *pgxpool.Pool
}

// Close closes the journal, and the pool of a PostgreSQL one.
func (j *openJournal) Close() error {
	if j.sqlite != nil {
		return j.sqlite.Close()
	}
	err := j.pg.Close()
	j.pool.Close()
	return err
}

// alive tells which workers are alive, on a journal that can tell
// (PostgreSQL); nil on SQLite, whose liveness locks a reader does not
// probe (probing one is taking it). On a standby it returns an error
// matching operator.ErrLivenessUnknown, which the views show as a note.
func (j *openJournal) alive(ctx context.Context) (map[string]bool, error) {
	if j.pg == nil {
		return nil, nil
	}
	owners, err := j.pg.Owners(ctx)
	if errors.Is(err, postgres.ErrLivenessUnknown) {
		return nil, fmt.Errorf("%w (%w)", operator.ErrLivenessUnknown, err)
	}
	if err != nil {
		return nil, err
	}
	m := map[string]bool{}
	for _, o := range owners {
		m[o.Name] = o.Alive
	}
	return m, nil
}

// isPostgres reports whether a --journal value names a PostgreSQL journal.
func isPostgres(loc string) bool {
	return strings.HasPrefix(loc, "postgres://") || strings.HasPrefix(loc, "postgresql://")
}

// withJournal opens the journal for what the command does, runs fn and
// closes it.
func withJournal(ctx context.Context, e *env, a access, fn func(j *openJournal) error) error {
	j, err := openJournalFor(ctx, e, a)
	if err != nil {
		return err
	}
	err = fn(j)
	if cerr := j.Close(); err == nil && cerr != nil {
		return cerr
	}
	return err
}

// openJournalFor opens the existing journal; it never creates one. A
// reading command opens it read-only, and refuses an older schema with
// the command that migrates it instead of migrating it.
func openJournalFor(ctx context.Context, e *env, a access) (*openJournal, error) {
	if isPostgres(e.journal) {
		return openPostgres(ctx, e, a)
	}
	if e.schemaSet {
		return nil, usagef("--schema names a schema of a PostgreSQL journal; %s is an SQLite journal's path", clean(e.journal))
	}
	if e.passwordEnv != "" {
		return nil, usagef("--password-env is for a PostgreSQL journal; %s is an SQLite journal's path", clean(e.journal))
	}
	opts := []idem.SQLiteOption{idem.SQLiteMustExist()}
	if a == reading {
		opts = append(opts, idem.SQLiteReadOnly())
	}
	j, err := idem.OpenSQLite(e.journal, opts...)
	if fe := (*idem.FileError)(nil); errors.Is(err, idem.ErrSchemaTooOld) && errors.As(err, &fe) {
		return nil, fmt.Errorf("journal %s: %v; a command that only reads does not migrate it: run 'idem --journal %s migrate' first",
			e.journal, fe.Err, e.journal)
	}
	if fe := (*idem.FileError)(nil); errors.Is(err, idem.ErrJournalUnrecovered) && errors.As(err, &fe) {
		return nil, fmt.Errorf("journal %s: %v: %v; a command that only reads changes neither file: run 'idem --journal %s migrate' first to roll that write back",
			e.journal, fe.Kind, fe.Err, e.journal)
	}
	if err != nil {
		return nil, err
	}
	return &openJournal{Journal: j, sqlite: j}, nil
}

// connectTimeout bounds the connection to a server that does not answer,
// unless the DSN sets connect_timeout.
const connectTimeout = 10 * time.Second

// postgresPool opens a pool on the DSN, the password taken from the DSN,
// $PGPASSWORD, the .pgpass file (as pgx reads them), or the environment
// variable --password-env names, and checks that the server answers. A
// reading command's sessions are not made read-only: a transaction pooler
// (PgBouncer in transaction mode, as a fleet has) refuses
// default_transaction_read_only as a startup parameter, and would not keep
// a session's setting from one transaction to the next. Its reads run in
// transactions begun READ ONLY instead (postgres.ReadOnly, readOnly).
func postgresPool(ctx context.Context, e *env, a access) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(e.journal)
	if err != nil {
		return nil, fmt.Errorf("--journal: not a PostgreSQL URL pgx can use: %v; want postgres://USER@HOST:PORT/DATABASE", err)
	}
	if e.passwordEnv != "" {
		pw := e.getenv(e.passwordEnv)
		if pw == "" {
			return nil, fmt.Errorf("--password-env %s: environment variable %s is unset or empty; export the password in it", e.passwordEnv, e.passwordEnv)
		}
		cfg.ConnConfig.Password = pw
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	if u, err := url.Parse(e.journal); err == nil && !u.Query().Has("default_query_exec_mode") {
		// pgx's default prepares each statement once per session, under
		// a name: behind a transaction pooler (PgBouncer before 1.21) the
		// next transaction's server session lacks it, or holds another
		// run's. A command's few statements gain nothing from it.
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL journal %s: %v", e.journalName(), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL journal %s: %s", e.journalName(), connectError(err))
	}
	return pool, nil
}

// connectError says why a connection failed, and what to check: the
// server's (or pooler's) refusal says what it refused, and the advice
// follows it; without one, the server was not reached.
func connectError(err error) string {
	// pgx reports each address it tried on a line of its own.
	why := strings.Join(strings.Fields(err.Error()), " ")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return fmt.Sprintf("cannot connect: %s; check the host and port, and that the server runs", why)
	}
	advice := "check the database, user and password, and the settings in the URL"
	switch {
	case strings.Contains(pe.Message, "startup parameter"):
		// PgBouncer's "unsupported startup parameter: NAME": a setting in
		// the URL's query that pgx sends at connection.
		advice = "remove that setting from the URL, or list it in the pooler's ignore_startup_parameters"
	case pe.Code == "28P01" || pe.Code == "28000": // invalid_password, invalid_authorization_specification
		advice = "check the user and password ($PGPASSWORD, ~/.pgpass, --password-env)"
	case pe.Code == "3D000": // invalid_catalog_name
		advice = "check the database named in the URL"
	case pe.Code == "53300": // too_many_connections
		advice = "the server has no connection to spare: try again later, or through the fleet's pooler"
	}
	return fmt.Sprintf("cannot connect: the server refused the connection: %s; %s", why, advice)
}

// readOnly runs fn in a transaction begun READ ONLY, so that the server
// refuses any write of it, behind a transaction pooler too: for the
// command's own statements, which read (the journal's own are
// postgres.ReadOnly's).
func readOnly(ctx context.Context, pool *pgxpool.Pool, fn func(tx pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, fn)
}

// openPostgres opens the journal in the schema --schema names (default
// "idem"), never migrating it.
func openPostgres(ctx context.Context, e *env, a access) (*openJournal, error) {
	pool, err := postgresPool(ctx, e, a)
	if err != nil {
		return nil, err
	}
	if err := checkPostgresJournal(ctx, e, pool); err != nil {
		pool.Close()
		return nil, err
	}
	opts := []postgres.Option{postgres.Schema(e.schema()), postgres.WithoutMigration()}
	if a == reading {
		opts = append(opts, postgres.ReadOnly())
	}
	j, err := postgres.OpenJournal(ctx, pool, opts...)
	if errors.Is(err, postgres.ErrNotMigrated) {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL journal %s is older than this build's: run 'idem --journal %s --schema %s migrate' first",
			e.journalName(), redactDSN(e.journal), e.schema())
	}
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL journal %s: %w", e.journalName(), err)
	}
	return &openJournal{Journal: j, pg: j, pool: pool}, nil
}

// checkPostgresJournal refuses a schema that holds no idem journal, with
// what to check: OpenJournal without migration says only that its tables
// are missing.
func checkPostgresJournal(ctx context.Context, e *env, pool *pgxpool.Pool) error {
	var exists bool
	table := pgx.Identifier{e.schema(), "operations"}.Sanitize()
	err := readOnly(ctx, pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists)
	})
	if err != nil {
		return fmt.Errorf("PostgreSQL journal %s: %v", e.journalName(), err)
	}
	if !exists {
		return fmt.Errorf("no idem journal in schema %q of %s: check --schema (default %q) and the database; an application's postgres.OpenJournal creates it",
			e.schema(), redactDSN(e.journal), defaultSchema)
	}
	return nil
}

// defaultSchema is the postgres package's default schema.
const defaultSchema = "idem"

// schema is --schema, else the default.
func (e *env) schema() string {
	if e.schemaSet {
		return e.schemaName
	}
	return defaultSchema
}

// journalName is how messages name the journal: its path, or its DSN
// without a password and its schema.
func (e *env) journalName() string {
	if !isPostgres(e.journal) {
		return e.journal
	}
	return fmt.Sprintf("%s (schema %q)", redactDSN(e.journal), e.schema())
}

// redactDSN is a DSN without its password, nor the passphrase of the
// client's TLS key (sslpassword), for messages and pages.
func redactDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "postgres://(a DSN that does not parse)"
	}
	if u.User != nil {
		u.User = url.User(u.User.Username())
	}
	q := u.Query()
	if q.Has("password") || q.Has("sslpassword") {
		q.Del("password")
		q.Del("sslpassword")
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// secrets are the strings no output may hold: the DSN's password, and
// the one --password-env names.
func (e *env) secrets() []string {
	var s []string
	// A URL of any scheme counts, and libpq's keyword form too: a value
	// the command does not take for a PostgreSQL URL is taken for a
	// path, and messages name the path.
	if u, err := url.Parse(e.journal); err == nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			s = append(s, pw, url.QueryEscape(pw), url.PathEscape(pw))
		}
		for _, name := range []string{"password", "sslpassword"} {
			if pw := u.Query().Get(name); pw != "" {
				s = append(s, pw, url.QueryEscape(pw))
			}
		}
	}
	for _, m := range keywordPassword.FindAllStringSubmatch(e.journal, -1) {
		if pw := m[1]; pw != "" {
			s = append(s, pw, strings.Trim(pw, "'"))
		}
	}
	if e.passwordEnv != "" {
		if pw := e.getenv(e.passwordEnv); pw != "" {
			s = append(s, pw)
		}
	}
	if pw := e.getenv("PGPASSWORD"); pw != "" && isPostgres(e.journal) {
		s = append(s, pw)
	}
	return s
}

// keywordPassword finds the password of libpq's keyword form,
// "host=H password=PW", quoted or not, and its sslpassword.
var keywordPassword = regexp.MustCompile(`(?:^|\s)(?:ssl)?password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)`)

// scrubbed is an error whose message has the secrets taken out; it
// unwraps to the original, so that its exit status is the same.
type scrubbed struct {
	msg string
	err error
}

func (s scrubbed) Error() string { return s.msg }
func (s scrubbed) Unwrap() error { return s.err }

// scrub takes every secret out of err's message.
func scrub(err error, secrets []string) error {
	if err == nil || len(secrets) == 0 {
		return err
	}
	msg := err.Error()
	for _, s := range secrets {
		if len(s) >= 1 {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	if msg == err.Error() {
		return err
	}
	return scrubbed{msg: msg, err: err}
}

// sqliteVersion reads an SQLite journal's schema version without opening
// it as a journal, on a read-only connection.
func sqliteVersion(ctx context.Context, path string) (int, error) {
	uri, err := sqlitefile.URI(path, url.Values{"mode": {"ro"}})
	if err != nil {
		return 0, err
	}
	db, err := sql.Open("sqlite3", uri)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var v int
	err = db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v)
	return v, err
}
