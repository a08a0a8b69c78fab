package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/operator"
)

var reconcileCommand = &command{
	name:    "reconcile",
	args:    "KEY|SCOPE/ID --as succeeded|rejected --note TEXT",
	summary: "record an operator's decision about an unknown or expired operation",
	help: `
Records an operator's decision about an operation whose outcome could not
be confirmed (unknown or expired, or in_flight left by a crashed process),
after checking the business records. Nothing is sent. The note says what
the decision is based on, such as "matched order 9812 in the ERP", and is
required. A settled operation cannot be reconciled, nor one that a live
process is driving (the error says which and until when); one whose
process is gone can be at once, its lease unexpired or not. The operation
is named as for "idem show".`,
	setup: func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		var as, note string
		fs.StringVar(&as, "as", "", "the `OUTCOME`: succeeded or rejected (required)")
		fs.StringVar(&note, "note", "", "`TEXT` saying what the decision is based on (required)")
		return func(ctx context.Context, e *env, args []string) error {
			if err := wantArgs("reconcile", args, "KEY or SCOPE/ID"); err != nil {
				return err
			}
			state, err := operator.ParseOutcome(as)
			switch {
			case errors.Is(err, operator.ErrNoOutcome):
				return usagef("reconcile: --as succeeded|rejected is required")
			case err != nil:
				return usagef("reconcile: --as %v", err)
			}
			if operator.CheckNote(note) != nil {
				return usagef("reconcile: --note is required: say what the decision is based on")
			}
			return settle(ctx, e, args[0], func(j idem.Journal, rec idem.Record) (string, error) {
				return operator.Reconcile(ctx, j, rec, state, note, e.now())
			})
		}
	},
}

var cancelCommand = &command{
	name:    "cancel",
	args:    "KEY|SCOPE/ID",
	summary: "withdraw a pending operation that was never sent",
	help: `
Withdraws a pending operation that was never sent: it ends canceled and is
never sent. An operation that may have reached the server cannot be
canceled: reconcile it instead. The operation is named as for "idem
show".`,
	setup: func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		return func(ctx context.Context, e *env, args []string) error {
			if err := wantArgs("cancel", args, "KEY or SCOPE/ID"); err != nil {
				return err
			}
			return settle(ctx, e, args[0], func(j idem.Journal, rec idem.Record) (string, error) {
				return operator.Cancel(ctx, j, rec, e.now())
			})
		}
	},
}

// settle finds the operation that arg names and applies an operator's
// change to it (package operator holds the rules, shared with idem ui).
func settle(ctx context.Context, e *env, arg string, change func(idem.Journal, idem.Record) (string, error)) error {
	return withJournal(ctx, e, writing, func(j *openJournal) error {
		rec, err := resolve(ctx, e, j, arg)
		if err != nil {
			return err
		}
		msg, err := change(j, rec)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(e.stdout, clean(msg))
		return err
	})
}
