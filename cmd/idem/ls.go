package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/operator"
)

// Column widths of the ls table, in runes; show prints everything whole.
const (
	lsScopeWidth = 20
	lsIDWidth    = 40
	lsErrorWidth = 60
	// lsFlushEvery bounds what the table holds in memory: column widths
	// are settled per block of rows.
	lsFlushEvery = 1000
)

var lsCommand = &command{
	name:    "ls",
	args:    "[--state S[,S...]] [--scope S] [--owner NAME] [--older-than D] [--json]",
	summary: "list operations, oldest first",
	help: `
Lists operations, oldest first: key, scope, operation ID, state, attempts,
age and last error, in a table (long IDs and errors are shortened; "idem
show" prints them whole) or, with --json, one JSON object per line (no
bodies).

A state marked "*" (past_retention in JSON) is an in_flight or unknown
operation whose server retention has passed: "idem resume" marks it
expired without sending anything, for an operator to reconcile.`,
	setup: func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		var (
			states stateList
			scope  = nameFlag{what: "a scope"}
			owner  = nameFlag{what: "a worker, as 'idem stats' lists them"}
			older  ageFlag
			asJSON bool
		)
		fs.Var(&states, "state", "only operations in these `STATES`, comma-separated: pending, in_flight, unknown, succeeded, rejected, expired, canceled; may be repeated")
		fs.Var(&scope, "scope", "only operations of `SCOPE`")
		fs.Var(&owner, "owner", "only operations whose lease `OWNER` holds or last held (a worker, as 'idem stats' lists them)")
		fs.Var(&older, "older-than", "only operations created more than `D` ago: a Go duration (90m, 36h) or days (7d)")
		fs.BoolVar(&asJSON, "json", false, "print one JSON object per line")
		return func(ctx context.Context, e *env, args []string) error {
			if err := wantArgs("ls", args); err != nil {
				return err
			}
			now := e.now()
			f := idem.Filter{Scope: scope.value, States: states}
			if older.set {
				f.CreatedBefore = now.Add(-older.d)
			}
			keep := func(idem.Record) bool { return true }
			if owner.value != "" {
				keep = func(rec idem.Record) bool { return rec.Lease.Owner == owner.value }
			}
			return withJournal(ctx, e, reading, func(j *openJournal) error {
				if asJSON {
					return listJSON(ctx, e, j, f, keep, now)
				}
				return listTable(ctx, e, j, f, keep, now)
			})
		}
	},
}

func listJSON(ctx context.Context, e *env, j idem.Journal, f idem.Filter, keep func(idem.Record) bool, now time.Time) error {
	for rec, err := range j.List(ctx, f) {
		if err != nil {
			return err
		}
		if !keep(rec) {
			continue
		}
		if err := writeJSON(e.stdout, newJSONRecord(rec, now)); err != nil {
			return err
		}
	}
	return nil
}

func listTable(ctx context.Context, e *env, j idem.Journal, f idem.Filter, keep func(idem.Record) bool, now time.Time) error {
	tw := newTable(e.stdout)
	n, overdue := 0, 0
	for rec, err := range j.List(ctx, f) {
		if err != nil {
			tw.Flush()
			return err
		}
		if !keep(rec) {
			continue
		}
		switch {
		case n == 0:
			row(tw, "KEY", "SCOPE", "ID", "STATE", "ATTEMPTS", "AGE", "LAST ERROR")
		case n%lsFlushEvery == 0:
			if err := tw.Flush(); err != nil {
				return err
			}
		}
		n++
		state := rec.State.String()
		if operator.PastRetention(rec, now) {
			state += "*"
			overdue++
		}
		row(tw, rec.Key, operator.CutMiddle(rec.Scope, lsScopeWidth), operator.CutMiddle(rec.ID, lsIDWidth), state,
			strconv.Itoa(rec.Attempts), operator.FormatAge(now.Sub(rec.CreatedAt)), operator.Cut(operator.LastError(rec), lsErrorWidth))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if n == 0 {
		_, err := fmt.Fprintln(e.stdout, "no operations")
		return err
	}
	if overdue > 0 {
		_, err := fmt.Fprintf(e.stdout, "* %s (%d operation(s))\n", operator.PastRetentionNote, overdue)
		return err
	}
	return nil
}
