// Package pgschema migrates the tables of idem's PostgreSQL journal and
// store, each in a schema the application names, and refuses, without
// changing anything, a schema that holds something else or was written by
// a newer idem: the same promises the SQLite files make.
package pgschema

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
)

// versionTable records, per kind of tables ("journal", "store"), the
// version of the tables the schema holds.
const versionTable = "idem_schema"

// lockClass is the first key of the advisory lock that serializes
// migrations (and that liveness locks use with other classes): "idem".
const lockClass int32 = 0x6964656d

// Kinds of tables, each migrated on its own.
type Kind struct {
	// Name is "journal" or "store".
	Name string
	// Marker is a table the kind always has: a schema that holds it
	// without a version is another program's.
	Marker string
	// Migrations[i] takes the kind's tables from version i to i+1. Each
	// is run with the schema as the search path.
	Migrations []string
}

// Error is a schema that cannot be used: foreign or too new. It matches
// idem.ErrNotJournal or idem.ErrSchemaTooNew with errors.Is.
type Error struct {
	Schema, Kind string
	Err          error // the sentinel and what was found
	Hint         string
}

func (e *Error) Error() string {
	return fmt.Sprintf("postgres %s in schema %q: %v; %s", e.Kind, e.Schema, e.Err, e.Hint)
}

func (e *Error) Unwrap() error { return e.Err }

// Ident quotes a schema or table name for SQL.
func Ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// ErrReadOnly is a database whose sessions refuse writes.
var ErrReadOnly = errors.New("the database refuses writes (a hot standby, or default_transaction_read_only on for the role or database)")

// readOnly is the error of opening kind's tables in schema on a database
// that refuses writes; err, when not nil, is the server's own.
func readOnly(kind, schema string, err error) error {
	if err == nil {
		return fmt.Errorf("postgres %s in schema %q: %w: point the pool at the primary, with a role that may write", kind, schema, ErrReadOnly)
	}
	return fmt.Errorf("postgres %s in schema %q: %w: point the pool at the primary, with a role that may write: %w", kind, schema, ErrReadOnly, err)
}

// Writable refuses, with an error matching ErrReadOnly, a pool whose
// sessions cannot write (transaction_read_only is on: a hot standby, or
// default_transaction_read_only for the role or database), for opening
// kind's tables in schema without migrating them, which would have met
// the refusal.
func Writable(ctx context.Context, pool *pgxpool.Pool, schema, kind string) error {
	var ro string
	if err := pool.QueryRow(ctx, "SHOW transaction_read_only").Scan(&ro); err != nil {
		return fmt.Errorf("postgres %s in schema %q: reading transaction_read_only: %w", kind, schema, err)
	}
	if ro == "on" {
		return readOnly(kind, schema, nil)
	}
	return nil
}

// readOnlyTransaction is the SQLSTATE of a write refused by a read-only
// transaction (read_only_sql_transaction).
const readOnlyTransaction = "25006"

// Migrate brings kind's tables in schema to the newest version, creating
// the schema if need be, in one transaction under an advisory lock, so
// that processes opening it at once migrate it once. It refuses a schema
// whose kind's marker table exists without a version (another program's
// tables) and a version newer than this build knows.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string, kind Kind) error {
	if schema == "" {
		return errors.New("postgres: the schema name is empty; name one, such as \"idem\"")
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext($2))", lockClass, schema); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+Ident(schema)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+Ident(schema)); err != nil {
			return err
		}
		version, err := Version(ctx, tx, schema, kind)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+versionTable+` (kind text PRIMARY KEY, version int NOT NULL)`); err != nil {
			return err
		}
		for i := version; i < len(kind.Migrations); i++ {
			if _, err := tx.Exec(ctx, kind.Migrations[i]); err != nil {
				return fmt.Errorf("postgres %s in schema %q: migration %d: %w", kind.Name, schema, i+1, err)
			}
		}
		if version == len(kind.Migrations) {
			return nil
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+versionTable+` (kind, version) VALUES ($1, $2)
			ON CONFLICT (kind) DO UPDATE SET version = excluded.version`, kind.Name, len(kind.Migrations))
		return err
	})
	// A hot standby, or a role or database whose transactions are read-only
	// by default, refuses even CREATE SCHEMA IF NOT EXISTS: the server's
	// error alone names neither the tables nor the way out.
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == readOnlyTransaction {
		return readOnly(kind.Name, schema, err)
	}
	if statementPooler(err) {
		return fmt.Errorf("postgres %s in schema %q: the pool reaches the database through a pooler in statement mode, "+
			"which refuses the transactions the %s needs: give its pool a pooler in transaction or session mode "+
			"(PgBouncer's pool_mode = transaction): %w", kind.Name, schema, kind.Name, err)
	}
	return err
}

// statementPooler reports PgBouncer's refusal of a transaction in
// statement pooling mode.
func statementPooler(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "08P01" && strings.Contains(pe.Message, "statement pooling mode")
}

// Version returns the version of kind's tables in schema, 0 when there are
// none, or an *Error when they are another program's or newer than this
// build.
func Version(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, schema string, kind Kind) (int, error) {
	// Looking at a table that does not exist would abort the transaction:
	// ask whether it does first.
	var version int
	var hasVersions bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, Ident(schema)+"."+versionTable).Scan(&hasVersions); err != nil {
		return 0, err
	}
	err := pgx.ErrNoRows
	if hasVersions {
		err = q.QueryRow(ctx, `SELECT version FROM `+Ident(schema)+`.`+versionTable+` WHERE kind = $1`, kind.Name).Scan(&version)
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// No version: new, unless the kind's tables are there already.
		var exists bool
		if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.tables
			WHERE table_schema = $1 AND table_name = $2)`, schema, kind.Marker).Scan(&exists); err != nil {
			return 0, err
		}
		if exists {
			return 0, &Error{Schema: schema, Kind: kind.Name,
				Err:  fmt.Errorf("%w: table %s exists without idem's version", idem.ErrNotJournal, kind.Marker),
				Hint: "name another schema, or move that program's tables"}
		}
		return 0, nil
	case err != nil:
		return 0, err
	case version > len(kind.Migrations):
		return 0, &Error{Schema: schema, Kind: kind.Name,
			Err:  fmt.Errorf("%w: version %d, this build knows up to %d", idem.ErrSchemaTooNew, version, len(kind.Migrations)),
			Hint: "upgrade idem to a version that wrote it"}
	}
	return version, nil
}
