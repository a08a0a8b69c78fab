package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/operator"
)

var statsCommand = &command{
	name:    "stats",
	args:    "[--json]",
	summary: "count operations by state and scope; oldest unsettled; workers; size",
	help: `
Prints the number of operations by state and by scope, the age of the
oldest operation not yet settled (pending, in_flight, unknown or expired),
the workers (each owner of a lease of an active operation: how many it
holds and when its first lease ends; on PostgreSQL whether it is alive or
gone, and the live workers that hold nothing; on SQLite, and for a worker
whose journal has no liveness, whether a lease of it is still holding or
has lapsed), and the journal's size: the file and its -wal, or the
schema's tables.`,
	setup: func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		var asJSON bool
		fs.BoolVar(&asJSON, "json", false, "print one JSON object")
		return func(ctx context.Context, e *env, args []string) error {
			if err := wantArgs("stats", args); err != nil {
				return err
			}
			return withJournal(ctx, e, reading, func(j *openJournal) error {
				counts, err := j.Count(ctx)
				if err != nil {
					return err
				}
				s, err := journalStats(ctx, e, j, counts)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(e.stdout, s)
				}
				return printStats(e, s, j.pg != nil)
			})
		}
	},
}

// journalStats sums counts, with the journal's size: its file and -wal,
// or its schema's tables and indexes.
func journalStats(ctx context.Context, e *env, j *openJournal, counts []idem.Count) (operator.Stats, error) {
	path := ""
	if j.sqlite != nil {
		path = j.sqlite.Path()
	}
	s, err := operator.NewStats(path, counts, e.now())
	if err != nil {
		return s, err
	}
	alive, err := j.alive(ctx)
	if errors.Is(err, operator.ErrLivenessUnknown) {
		s.LivenessUnknown, alive, err = operator.ErrLivenessUnknown.Error(), nil, nil
	}
	if err != nil {
		return s, err
	}
	if s.Workers, err = operator.Fleet(ctx, j, alive, e.now()); err != nil {
		return s, err
	}
	if j.sqlite != nil {
		return s, nil
	}
	s.Journal = e.journalName()
	err = readOnly(ctx, j.pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
			JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r'`, j.pg.Schema()).Scan(&s.SizeBytes)
	})
	return s, err
}

// printStats prints s as a table.
func printStats(e *env, s operator.Stats, onPostgres bool) error {
	w := e.stdout
	tw := newTable(w)
	row(tw, "journal", clean(s.Journal))
	if onPostgres {
		row(tw, "size", operator.FormatBytes(s.SizeBytes)+" (the schema's tables, with their indexes and TOAST)")
	} else {
		row(tw, "size", fmt.Sprintf("%s (file %s, wal %s)", operator.FormatBytes(s.SizeBytes), operator.FormatBytes(s.FileBytes), operator.FormatBytes(s.WALBytes)))
	}
	row(tw, "operations", strconv.Itoa(s.Total))
	oldestLine := "none"
	if o := s.OldestUnsettled; o != nil {
		oldestLine = fmt.Sprintf("%s old (%s, scope %s, created %s)", operator.FormatAge(time.Duration(o.AgeSeconds)*time.Second),
			o.State, o.Scope, o.CreatedAt.Format("2006-01-02 15:04:05.000Z07:00"))
	}
	row(tw, "oldest unsettled", oldestLine)
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nworkers (owners of leases; on PostgreSQL, alive or gone):")
	if s.LivenessUnknown != "" {
		fmt.Fprintf(w, "  %s; the statuses below are the leases'\n", s.LivenessUnknown)
	}
	if len(s.Workers) == 0 {
		fmt.Fprintln(w, "  (none)")
	} else {
		tw = newTable(w)
		row(tw, "  OWNER", "STATUS", "OPERATIONS", "OLDEST LEASE")
		for _, wk := range s.Workers {
			lease := "-"
			if wk.OldestLease != nil {
				lease = "until " + operator.FormatTime(*wk.OldestLease, e.now())
			}
			row(tw, "  "+clean(wk.Owner), wk.Status, strconv.Itoa(wk.Operations), lease)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(w, "\nby state:")
	tw = newTable(w)
	for _, st := range idem.States() {
		row(tw, "  "+st.String(), strconv.Itoa(s.ByState[st.String()]))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nby scope:")
	if len(s.ByScope) == 0 {
		fmt.Fprintln(w, "  (none)")
		return nil
	}
	tw = newTable(w)
	head := []string{"  SCOPE", "TOTAL"}
	for _, st := range idem.States() {
		head = append(head, st.String())
	}
	row(tw, head...)
	for _, sc := range s.ByScope {
		cells := []string{"  " + sc.Scope, strconv.Itoa(sc.Total)}
		for _, st := range idem.States() {
			cells = append(cells, strconv.Itoa(sc.ByState[st.String()]))
		}
		row(tw, cells...)
	}
	return tw.Flush()
}
