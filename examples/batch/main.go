// Batch shows a monthly payroll run that is safe to stop and to run again,
// even on a machine that lost its journal.
//
// Each employee's payment is one logical operation,
// "payroll/2026-11/emp-<n>" in the company's scope, with a deterministic
// key (idem.KeyDeterministic): a UUIDv5 of the scope and the operation ID.
// The program runs the month and stops it after 10 of 20 payments, then
// runs it again on the same journal: the 10 made are returned from the
// journal, the other 10 are made. Then it runs the month a third time with
// a new, empty journal, as a machine that lost its disk would: the same
// keys are sent, the payments service answers from its store of keys, and
// there are still 20 payments.
//
//	go run ./examples/batch
//
// Start from this program for a batch or scheduled job that makes one
// state-changing call per item (payouts, invoices, notifications) and must
// be safe to interrupt and to re-run. payMonth and newClient are the code to
// copy; demo_server.go is the in-process payments service.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/google/uuid"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/demo"
)

var journalFlag = flag.String("journal", "", "journal file of the first two runs, to create and keep (default: a temporary file, removed at the end)")

const (
	company = "acme-gmbh"
	month   = "2026-11"
)

// employee is one line of the payroll.
type employee struct {
	ID          string
	AmountCents int64
}

func payroll() []employee {
	staff := make([]employee, 20)
	for i := range staff {
		staff[i] = employee{ID: fmt.Sprintf("emp-%d", i+1), AmountCents: 250_000 + int64(i)*12_500}
	}
	return staff
}

func main() {
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "batch:", err)
		os.Exit(1)
	}
}

// keyNamespace is the namespace of this job's deterministic keys. It is
// written here so that the demo runs anywhere; a real job reads it from its
// secret store (generated once with uuid.New()).
var keyNamespace = uuid.MustParse("9b0e3c52-4f1d-4c7a-8d2e-6a1b5c3f7e90")

// newClient is the client configuration of the payroll job.
func newClient(journal idem.Journal, bankURL string, onTransition func(idem.Transition)) (*idem.Client, error) {
	return idem.New(idem.Config{
		Journal: journal,
		BaseURL: bankURL,
		Status:  idem.StatusEndpoint(bankURL + "/idempotency"),
		// Every payment of this job belongs to the company.
		Scope: company,
		// Deterministic keys: each key is a UUIDv5 of KeyNamespace, the
		// scope and the operation ID, so a payment has the same key on any
		// machine, with or without its journal. A re-run from scratch (a
		// lost disk, a fresh container) is then answered from the payment
		// service's store of keys instead of paying twice, as long as the
		// service still keeps the keys (typically 24 h). The journal stays
		// the first guard: with it, nothing already settled is even sent.
		// KeyNamespace is the application's own: whoever knows it can
		// compute its keys, so a real job loads it from its secret store,
		// like a credential, and never changes it.
		Keys:         idem.KeyDeterministic,
		KeyNamespace: keyNamespace,
		OnTransition: onTransition,
	})
}

// payMonth pays every employee for month, once. It is safe to stop at any
// point and to run again: each payment is one logical operation, named by
// the month and the employee, so a re-run finds the journaled key and
// result of every payment already made and sends only the others. report
// is told each payment's answer, or why it is not settled yet.
func payMonth(ctx context.Context, client *idem.Client, month string, staff []employee, report func(employee, *idem.Result, error)) error {
	for _, e := range staff {
		if err := ctx.Err(); err != nil {
			return err
		}
		body, err := json.Marshal(payment{Employee: e.ID, AmountCents: e.AmountCents, Currency: "EUR", Period: month})
		if err != nil {
			return err
		}
		res, err := client.Do(ctx, idem.Op{
			// An ID, not personal data: it is journaled in clear.
			ID:     "payroll/" + month + "/" + e.ID,
			URL:    "/payments",
			Header: http.Header{"Content-Type": {"application/json"}},
			Body:   body,
		})
		switch {
		case err == nil:
			report(e, res, nil) // paid
		case errors.Is(err, idem.ErrRejected):
			// Refused for good (the bank said no): res holds its answer,
			// and the payment is never sent again. Go on with the others.
			report(e, res, nil)
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, idem.ErrOutcomeUnknown), errors.Is(err, idem.ErrNotSent):
			// Journaled but not settled: the next run (or Resume) finishes
			// it with the same key. Go on with the others.
			report(e, nil, err)
		default:
			return err
		}
	}
	return nil
}

// outcome is what one run did for one employee.
type outcome struct {
	key, how string
}

// runMonth runs payMonth as one execution of the job, on the journal at
// journalPath, and records each employee's outcome. With stopAfter > 0 the
// run is stopped (its context canceled) after that many payments.
func runMonth(ctx context.Context, out io.Writer, journalPath, bankURL string, staff []employee, stopAfter int, outcomes map[string]outcome) error {
	journal, err := idem.OpenSQLite(journalPath)
	if err != nil {
		return err
	}
	defer journal.Close()
	created := map[string]bool{} // operations this run journaled for the first time
	client, err := newClient(journal, bankURL, func(t idem.Transition) {
		if !t.From.Valid() {
			created[t.ID] = true
			return
		}
		if t.To != idem.StateInFlight && t.To != idem.StateSucceeded {
			fmt.Fprintf(out, "   key %.8s… %s: %s → %s (%s)\n", t.Key, t.ID, t.From, t.To, t.Reason)
		}
	})
	if err != nil {
		return err
	}
	defer client.Close()

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	paid := 0
	counts := map[string]int{}
	err = payMonth(runCtx, client, month, staff, func(e employee, res *idem.Result, err error) {
		var o outcome
		switch {
		case err != nil:
			o.how = "not settled yet"
			fmt.Fprintf(out, "   %s: %v\n", e.ID, err)
		case !res.Succeeded():
			o.key, o.how = res.Key, fmt.Sprintf("refused (HTTP %d)", res.StatusCode)
		case !created[res.ID]:
			o.key, o.how = res.Key, "from the journal"
		case res.Replayed:
			// Sent by this run, and the server answered from its store:
			// it had made this payment before.
			o.key, o.how = res.Key, "replayed by the server"
		default:
			o.key, o.how = res.Key, "paid"
		}
		outcomes[e.ID] = o
		counts[o.how]++
		if res != nil && res.Succeeded() {
			if paid++; paid == stopAfter {
				stop() // stands for a deploy, a Ctrl-C, a drained node
			}
		}
	})
	switch {
	case err == nil:
	case errors.Is(err, context.Canceled) && ctx.Err() == nil && stopAfter > 0:
		fmt.Fprintf(out, "   stopped after %d payments: %v\n", paid, err)
	default:
		return err
	}
	var summary []string
	for _, how := range slices.Sorted(maps.Keys(counts)) {
		summary = append(summary, fmt.Sprintf("%d %s", counts[how], how))
	}
	fmt.Fprintf(out, "   this run: %s\n", strings.Join(summary, ", "))
	return nil
}

func run(ctx context.Context, out io.Writer) error {
	out = demo.NewSyncWriter(out)
	tmp, err := os.MkdirTemp("", "idem-batch-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	journalPath, err := demo.JournalPath(tmp, "ops.db", *journalFlag)
	if err != nil {
		return err
	}
	bank, err := startBank()
	if err != nil {
		return err
	}
	defer bank.Close()
	staff := payroll()
	fmt.Fprintf(out, "payments service on %s, journal %s\n", bank.URL, journalPath)

	var requests int
	runs := make([]map[string]outcome, 3)
	for i := range runs {
		runs[i] = map[string]outcome{}
	}
	fmt.Fprintf(out, "\n1. Run the %s payroll of %s for %d employees; it is stopped after 10 payments.\n", month, company, len(staff))
	requests = bank.Requests()
	if err := runMonth(ctx, out, journalPath, bank.URL, staff, 10, runs[0]); err != nil {
		return err
	}
	fmt.Fprintf(out, "   requests to the payments service: %d; payments on the server: %d\n", bank.Requests()-requests, bank.Payments())

	fmt.Fprintln(out, "\n2. Run the month again on the same journal.")
	requests = bank.Requests()
	if err := runMonth(ctx, out, journalPath, bank.URL, staff, 0, runs[1]); err != nil {
		return err
	}
	fmt.Fprintf(out, "   requests to the payments service: %d; payments on the server: %d\n", bank.Requests()-requests, bank.Payments())

	fmt.Fprintln(out, "\n3. Run the month a third time, with a new, empty journal (a machine that lost its journal).")
	fmt.Fprintln(out, "   The deterministic keys are the same, so the payments service recognizes every payment.")
	requests = bank.Requests()
	if err := runMonth(ctx, out, filepath.Join(tmp, "new-machine.db"), bank.URL, staff, 0, runs[2]); err != nil {
		return err
	}
	fmt.Fprintf(out, "   requests to the payments service: %d; payments on the server: %d\n", bank.Requests()-requests, bank.Payments())

	fmt.Fprintln(out, "\n4. Employee by employee:")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "   employee\tamount\tkey (all runs)\trun 1\trun 2\trun 3 (new journal)")
	for _, e := range staff {
		key, hows := "", make([]string, len(runs))
		for i, r := range runs {
			o, ok := r[e.ID]
			if !ok {
				hows[i] = "-"
				continue
			}
			hows[i] = o.how
			switch {
			case key == "":
				key = o.key
			case o.key != "" && o.key != key:
				return fmt.Errorf("%s was sent with key %s in one run and %s in another", e.ID, key, o.key)
			}
		}
		fmt.Fprintf(tw, "   %s\t%s\t%.8s…\t%s\t%s\t%s\n", e.ID, euros(e.AmountCents), key, hows[0], hows[1], hows[2])
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	n := bank.Payments()
	fmt.Fprintf(out, "\n%d employees, %d payments on the server.\n", len(staff), n)
	if n != len(staff) {
		return fmt.Errorf("the payments service made %d payments for %d employees", n, len(staff))
	}
	return nil
}

// euros formats cents as 2,625.00 EUR.
func euros(cents int64) string {
	s := fmt.Sprintf("%d", cents/100)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return fmt.Sprintf("%s.%02d EUR", s, cents%100)
}
