package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
)

var migrateCommand = &command{
	name:    "migrate",
	args:    "",
	summary: "migrate a journal of an older schema to this build's, in place",
	help: `
Migrates a journal written by an older idem to this build's schema, in
place, and says from which version to which. The commands that only read
(ls, show, stats, ui without --allow-writes) never migrate: they refuse an
older journal and name this command. A journal of this build's schema is
left as it is. It never creates a journal: an application opening one
does.`,
	setup: func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		return func(ctx context.Context, e *env, args []string) error {
			if err := wantArgs("migrate", args); err != nil {
				return err
			}
			if isPostgres(e.journal) {
				return migratePostgres(ctx, e)
			}
			return migrateSQLite(ctx, e)
		}
	},
}

func migrateSQLite(ctx context.Context, e *env) error {
	if e.schemaSet || e.passwordEnv != "" {
		return usagef("--schema and --password-env are for a PostgreSQL journal; %s is an SQLite journal's path", clean(e.journal))
	}
	from, verr := sqliteVersion(ctx, e.journal)
	// Opening for writing is what migrates, in one transaction; it refuses
	// what is not a journal before touching it.
	j, err := idem.OpenSQLite(e.journal, idem.SQLiteMustExist())
	if err != nil {
		return err
	}
	if err := j.Close(); err != nil {
		return err
	}
	to, err := sqliteVersion(ctx, e.journal)
	if err != nil {
		return err
	}
	switch {
	case verr == nil && from < to:
		_, err = fmt.Fprintf(e.stdout, "migrated journal %s from schema version %d to %d\n", clean(e.journal), from, to)
	case verr != nil:
		// Unread before (a hot rollback journal, which the open rolled
		// back): whether it migrated is not known, only where it is.
		_, err = fmt.Fprintf(e.stdout, "journal %s is at schema version %d\n", clean(e.journal), to)
	default:
		_, err = fmt.Fprintf(e.stdout, "journal %s is already at schema version %d: nothing to do\n", clean(e.journal), to)
	}
	return err
}

func migratePostgres(ctx context.Context, e *env) error {
	pool, err := postgresPool(ctx, e, writing)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkPostgresJournal(ctx, e, pool); err != nil {
		return err
	}
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(e.schema()), postgres.WithoutMigration())
	if err == nil {
		j.Close()
		_, err = fmt.Fprintf(e.stdout, "journal %s is already at this build's schema: nothing to do\n", clean(e.journalName()))
		return err
	}
	if !errors.Is(err, postgres.ErrNotMigrated) {
		return fmt.Errorf("PostgreSQL journal %s: %w", e.journalName(), err)
	}
	if err := postgres.MigrateJournal(ctx, pool, e.schema()); err != nil {
		return fmt.Errorf("PostgreSQL journal %s: %w", e.journalName(), err)
	}
	_, err = fmt.Fprintf(e.stdout, "migrated journal %s to this build's schema\n", clean(e.journalName()))
	return err
}
