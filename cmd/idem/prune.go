package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/journal"
)

var pruneCommand = &command{
	name:    "prune",
	args:    "--older-than D [--dry-run]",
	summary: "delete settled operations last updated more than D ago",
	help: `
Deletes settled operations (succeeded, rejected, canceled) last updated
more than D ago, with their history, and prints how many. Expired
operations wait for an operator and are kept, as are unsettled ones. With
--dry-run it only counts them.`,
	setup: func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		var older ageFlag
		var dryRun bool
		fs.Var(&older, "older-than", "prune operations last updated more than `D` ago: a Go duration (90m, 36h) or days (7d); required")
		fs.BoolVar(&dryRun, "dry-run", false, "count what would be pruned; delete nothing")
		return func(ctx context.Context, e *env, args []string) error {
			if err := wantArgs("prune", args); err != nil {
				return err
			}
			if !older.set {
				return usagef("prune: --older-than is required, such as --older-than 7d")
			}
			before := e.now().Add(-older.d)
			return withJournal(ctx, e, writing, func(j *openJournal) error {
				cutoff := before.UTC().Format(time.RFC3339)
				if dryRun {
					n, err := countPrunable(ctx, j, before)
					if err != nil {
						return err
					}
					_, err = fmt.Fprintf(e.stdout, "would prune %d operation(s) settled and last updated before %s (dry run: nothing deleted)\n", n, cutoff)
					return err
				}
				n, err := j.Prune(ctx, before)
				if err != nil {
					return fmt.Errorf("pruned %d operation(s), then: %w", n, err)
				}
				_, err = fmt.Fprintf(e.stdout, "pruned %d operation(s) settled and last updated before %s\n", n, cutoff)
				return err
			})
		}
	},
}

// countPrunable counts what Prune(before) would delete.
func countPrunable(ctx context.Context, j idem.Journal, before time.Time) (int, error) {
	var f idem.Filter
	for _, st := range idem.States() {
		if st.Terminal() {
			f.States = append(f.States, st)
		}
	}
	n := 0
	for rec, err := range j.List(ctx, f) {
		if err != nil {
			return 0, err
		}
		if journal.Prunable(rec, before) {
			n++
		}
	}
	return n, nil
}
