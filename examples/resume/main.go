// Resume shows a real crash and what a restart does about it.
//
// The program runs the application as a child process of itself. The
// application places three orders with a demo shop, which creates the third
// order and holds its answer; at that moment the program kills the
// application with SIGKILL: no deferred cleanup, no Close, the journal left
// exactly as the crash left it. Then the program starts again, as a
// supervisor would restart a service: it opens the same journal file,
// prints what it holds (the third order in_flight: sent, outcome unknown),
// and calls Resume, which asks the shop's status endpoint and finishes the
// order without placing it a second time.
//
//	go run ./examples/resume
//
// Start from this program when you add idem to a service that can be
// killed, redeployed or run out of memory mid-request. runApplication is
// the code that places orders; runAfterRestart is the start-up code every
// such service needs (open the journal, New, Resume). crash.go starts and
// kills the child process and examples/internal/demo holds the shop: both are demo
// scaffolding.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/demo"
)

var journalFlag = flag.String("journal", "", "journal file to create and keep (default: a temporary file, removed at the end)")

// carts are the orders the application places, one logical operation each.
var carts = []struct {
	ID, Item string
	Quantity int
}{
	{"checkout/cart-1", "book", 1},
	{"checkout/cart-2", "pen", 3},
	{"checkout/cart-3", "lamp", 2},
}

func main() {
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	if isApplication() {
		err = applicationMain(ctx) // the child process: see crash.go
	} else {
		err = run(ctx, os.Stdout)
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "resume:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	out = demo.NewSyncWriter(out)
	tmp, err := os.MkdirTemp("", "idem-resume-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	flagPath := *journalFlag
	if flagPath != "" {
		if flagPath, err = filepath.Abs(flagPath); err != nil {
			return err
		}
	}
	journalPath, err := demo.JournalPath(tmp, "ops.db", flagPath)
	if err != nil {
		return err
	}

	shop, err := demo.StartShop(tmp)
	if err != nil {
		return err
	}
	defer shop.Close()
	held := shop.HoldAnswerOf(len(carts)) // the last order's answer is held
	fmt.Fprintf(out, "demo shop on %s (in this process: it outlives the crash), journal %s\n", shop.URL, journalPath)

	fmt.Fprintf(out, "\n1. Start the application as a child process. It places %d orders; the shop holds the answer to the last.\n", len(carts))
	app, err := startApplication(ctx, out, journalPath, shop.URL)
	if err != nil {
		return err
	}
	defer app.Kill()
	last := carts[len(carts)-1].ID
	// Kill it once the shop has created the last order (its orders table
	// says so) and stored the answer under the key, so that the crash
	// falls exactly between "the server did it" and "the client knows".
	if err := app.WaitFor(ctx, last+": new → in_flight", func() bool {
		n, err := shop.Orders(ctx)
		select {
		case <-held:
			return err == nil && n == len(carts)
		default:
			return false
		}
	}); err != nil {
		return err
	}

	fmt.Fprintf(out, "\n2. The shop has created the order of %s and holds its answer. Kill the application (pid %d) with SIGKILL.\n", last, app.Pid())
	fmt.Fprintf(out, "   %s\n", app.Kill())

	fmt.Fprintln(out, "\n3. Start again, as a restarted service would.")
	posts, statuses := shop.OrderRequests(), shop.StatusRequests()
	if err := runAfterRestart(ctx, out, journalPath, shop.URL); err != nil {
		return err
	}
	fmt.Fprintf(out, "   The restart sent %d POST /orders and %d status request(s).\n",
		shop.OrderRequests()-posts, shop.StatusRequests()-statuses)

	n, err := shop.Orders(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n4. %d logical operations, %d orders on the server.\n", len(carts), n)
	if n != len(carts) {
		return fmt.Errorf("the shop holds %d orders for %d logical operations", n, len(carts))
	}
	return nil
}

// runApplication is the application: it places the orders, one logical
// operation each, and prints what it gets. It runs in the child process,
// which is killed in the middle of it.
func runApplication(ctx context.Context, out io.Writer, journalPath, shopURL string) error {
	journal, err := idem.OpenSQLite(journalPath)
	if err != nil {
		return err
	}
	defer journal.Close()
	client, err := idem.New(idem.Config{
		Journal: journal,
		BaseURL: shopURL,
		Status:  idem.StatusEndpoint(shopURL + "/idempotency"),
		// A lease says which process drives an operation. While this
		// process lives, its client renews its leases every third of
		// LeaseDuration; when it dies, nobody renews them, and another
		// process (or this one, restarted) takes its operations over once
		// they run out. So LeaseDuration is how long a crashed process's
		// operations wait for a successor: 1 s here, so that the restart
		// takes over at once. The default, 15 s, rides out long pauses of
		// a live process (GC, a stalled disk) without a take-over.
		LeaseDuration: time.Second,
		OnTransition:  demo.PrintTransitions(out),
	})
	if err != nil {
		return err
	}
	defer client.Close()
	for _, c := range carts {
		fmt.Fprintf(out, "placing %s\n", c.ID)
		res, err := client.Do(ctx, placeOrder(c.ID, c.Item, c.Quantity))
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "→ order %s\n", demo.OrderID(res.Body))
	}
	return nil
}

// runAfterRestart is what a service does when it starts: open the journal
// it used before, and finish what the previous run left unfinished.
func runAfterRestart(ctx context.Context, out io.Writer, journalPath, shopURL string) error {
	journal, err := idem.OpenSQLite(journalPath)
	if err != nil {
		return err
	}
	defer journal.Close()

	// What the crash left. Nothing is ever recorded as succeeded before
	// the shop's answer is in hand: the last order reads in_flight (it was
	// sent; its outcome is unknown), still leased by the dead process.
	fmt.Fprintln(out, "   The journal holds:")
	var leasedUntil time.Time
	for rec, err := range journal.List(ctx, idem.Filter{}) {
		if err != nil {
			return err
		}
		line := fmt.Sprintf("     %s  key %s  %s", rec.ID, rec.Key, rec.State)
		if rec.Response != nil {
			line += fmt.Sprintf(" (order %s)", demo.OrderID(rec.Response.Body))
		}
		if rec.State.Active() && rec.Lease.Owner != "" {
			line += fmt.Sprintf(", leased by %s for %s more", rec.Lease.Owner, time.Until(rec.Lease.ExpiresAt).Round(100*time.Millisecond))
			if rec.Lease.ExpiresAt.After(leasedUntil) {
				leasedUntil = rec.Lease.ExpiresAt
			}
		}
		fmt.Fprintln(out, line)
	}

	client, err := idem.New(idem.Config{
		Journal:      journal,
		BaseURL:      shopURL,
		Status:       idem.StatusEndpoint(shopURL + "/idempotency"),
		OnTransition: demo.PrintTransitions(out),
	})
	if err != nil {
		return err
	}
	defer client.Close()

	// Resume takes up every due operation that no live process holds: it
	// checks the status of those that may have reached the server before
	// re-sending anything, and sends those that never left. A dead
	// process's operations are free once its leases run out. A service
	// calls Resume at start-up and then every few seconds; this loop
	// stands for that.
	if wait := time.Until(leasedUntil); wait > 0 {
		fmt.Fprintf(out, "   Waiting %s for the dead process's lease to run out.\n", wait.Round(100*time.Millisecond))
	}
	for {
		rep, err := client.Resume(ctx)
		if err != nil {
			return err
		}
		if rep.Claimed > 0 {
			fmt.Fprintf(out, "   Resume: claimed %d, succeeded %d, rejected %d, still pending %d, still unknown %d, expired %d, failed %d\n",
				rep.Claimed, rep.Succeeded, rep.Rejected, rep.Pending, rep.Unknown, rep.Expired, rep.Failed)
		}
		left, err := unsettled(ctx, journal)
		if err != nil || left == 0 {
			return err
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// unsettled counts the operations that are neither settled nor waiting
// for an operator.
func unsettled(ctx context.Context, journal idem.Journal) (int, error) {
	n := 0
	for _, err := range journal.List(ctx, idem.Filter{States: []idem.State{idem.StatePending, idem.StateInFlight, idem.StateUnknown}}) {
		if err != nil {
			return 0, err
		}
		n++
	}
	return n, nil
}

// placeOrder is the logical operation "place the order of this cart". Its
// ID names the operation, not the attempt: after a restart the same ID
// finds the same journaled key.
func placeOrder(id, item string, quantity int) idem.Op {
	body, _ := json.Marshal(map[string]any{"item": item, "quantity": quantity})
	return idem.Op{
		ID:     id,
		URL:    "/orders",
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   body,
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
