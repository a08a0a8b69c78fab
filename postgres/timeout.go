package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// queryCanceled is the SQLSTATE of a statement canceled by
// statement_timeout (or by pg_cancel_backend, which says so otherwise).
const queryCanceled = "57014"

// timeoutAdvice says, after an error that is a statement cut off by the
// session's statement_timeout, what to do; for any other error it is empty.
// The journal and the store set no statement_timeout of their own: a
// session default meant for an application's queries (a role's, or the
// pool's RuntimeParams) applies to theirs, and a busy or locked table can
// make one wait past it.
func timeoutAdvice(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != queryCanceled || !strings.Contains(pe.Message, "statement timeout") {
		return ""
	}
	return "; the statement ran past the session's statement_timeout: raise it for the role the pool connects as " +
		"(ALTER ROLE … SET statement_timeout), or for the pool's sessions (RuntimeParams in the pool's configuration, " +
		"or a pool of the journal's own), or find what held the table (a lock, a long migration)"
}

// readOnlyTransaction is the SQLSTATE of a write refused by a read-only
// transaction (read_only_sql_transaction).
const readOnlyTransaction = "25006"

// asReadOnly wraps err, when it is a write refused because the session
// cannot write, with ErrReadOnly, which names what makes it so, and says
// what to do; any other error comes back as it is. The journal and the
// store leave default_transaction_read_only as the operator set it: on for
// the role or the database, it stops their writes as it stops the
// application's (a guard during maintenance, say), and each call that
// needs a write fails, having written nothing, until it is lifted.
func asReadOnly(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != readOnlyTransaction {
		return err
	}
	return fmt.Errorf("%w: %w; nothing was written: point the pool at the primary, or lift the setting, and the same call goes on", ErrReadOnly, err)
}

// readsBytea refuses a pool that would read the bytea columns of the journal or the store (kind) in a
// form pgx cannot parse: one that reads results as text (the exec and
// simple-protocol modes, as behind a PgBouncer older than 1.21), whose
// sessions write bytea in the escape form (bytea_output, which a role or
// a database may set). pgx parses only hex, the server's default; in
// binary (pgx's other modes) the setting plays no part. Every read of a
// record or an entry (a claim of a key already there, a Resume) would
// fail.
func readsBytea(ctx context.Context, pool *pgxpool.Pool, kind, schema string) error {
	switch pool.Config().ConnConfig.DefaultQueryExecMode {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
	default:
		return nil
	}
	var out string
	err := onLiveSessionRead(ctx, pool, func() error { return pool.QueryRow(ctx, `SHOW bytea_output`).Scan(&out) })
	if err != nil {
		return fmt.Errorf("postgres %s in schema %q: reading bytea_output: %w", kind, schema, err)
	}
	if out == "hex" {
		return nil
	}
	return fmt.Errorf("postgres %s in schema %q: the pool's sessions write bytea as %q (bytea_output, set for the role or the database), "+
		"and the pool reads results as text (default_query_exec_mode %v), in which pgx reads only hex: "+
		"add bytea_output=hex to the pool's connection string (or its RuntimeParams)", kind, schema, out, pool.Config().ConnConfig.DefaultQueryExecMode)
}
