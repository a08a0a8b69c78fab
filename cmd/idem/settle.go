package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem"
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
process is driving. The operation is named as for "idem show".`,
	setup: func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		var as, note string
		fs.StringVar(&as, "as", "", "the `OUTCOME`: succeeded or rejected (required)")
		fs.StringVar(&note, "note", "", "`TEXT` saying what the decision is based on (required)")
		return func(ctx context.Context, e *env, args []string) error {
			if err := wantArgs("reconcile", args, "KEY or SCOPE/ID"); err != nil {
				return err
			}
			if as == "" {
				return usagef("reconcile: --as succeeded|rejected is required")
			}
			state, err := idem.ParseState(as)
			if err != nil || (state != idem.StateSucceeded && state != idem.StateRejected) {
				return usagef("reconcile: --as %q: an operation is reconciled as succeeded or rejected", as)
			}
			if strings.TrimSpace(note) == "" {
				return usagef("reconcile: --note is required: say what the decision is based on")
			}
			return settle(ctx, e, args[0], func(c *idem.Client, rec idem.Record) (string, error) {
				if err := c.Reconcile(ctx, rec.Key, state, note); err != nil {
					return "", err
				}
				return fmt.Sprintf("reconciled %s (%s/%s) as %s, was %s", rec.Key, rec.Scope, rec.ID, state, rec.State), nil
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
			return settle(ctx, e, args[0], func(c *idem.Client, rec idem.Record) (string, error) {
				if err := c.Cancel(ctx, rec.Key); err != nil {
					return "", err
				}
				return fmt.Sprintf("canceled %s (%s/%s)", rec.Key, rec.Scope, rec.ID), nil
			})
		}
	},
}

// settle finds the operation that arg names and applies an operator's
// change to it through a client, which enforces what may change.
func settle(ctx context.Context, e *env, arg string, change func(*idem.Client, idem.Record) (string, error)) error {
	return withJournal(e, func(j *idem.SQLiteJournal) error {
		rec, err := resolve(ctx, e, j, arg)
		if err != nil {
			return err
		}
		// The client's operator calls do not check leases: refuse to
		// change an operation that a live process is driving.
		if now := e.now(); rec.Lease.Held(now) {
			return fmt.Errorf("operation %s (%s/%s) is %s and being driven by %s until %s; wait for it to stop, then look again",
				rec.Key, rec.Scope, rec.ID, rec.State, rec.Lease.Owner, rec.Lease.ExpiresAt.UTC().Format(time.RFC3339))
		}
		c, err := idem.New(idem.Config{Journal: j})
		if err != nil {
			return err
		}
		defer c.Close()
		msg, err := change(c, rec)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(e.stdout, clean(msg))
		return err
	})
}
