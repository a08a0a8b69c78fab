// Checkout is the first idem program to run. It places two orders with a
// demo shop whose network misbehaves and shows, step by step, how one
// idempotency key per logical operation keeps every order single:
//
//  1. the shop creates order checkout/cart-42 and the answer is lost on the
//     way back: the client asks the shop's status endpoint and returns the
//     original order instead of placing a second one;
//  2. calling Do again for the same operation returns the journaled result
//     without sending anything;
//  3. the process "crashes" while order checkout/cart-43 is on the wire; a
//     new client on the same journal file finds it and Resume finishes it,
//     again without a second order;
//  4. the shop's own count: one order per logical operation.
//
// Run it with
//
//	go run ./examples/checkout
//
// or keep the journal, to look at it afterwards with the operator CLI:
//
//	go run ./examples/checkout -journal /tmp/ops.db
//	(cd cmd/idem && go run . --journal /tmp/ops.db ls)
//
// Start from this program when your code calls an HTTP API that changes
// something (creates an order, charges a card, books a slot) and a timeout
// or a restart must never turn into a duplicate. main.go is what your
// application would contain; examples/internal/demo holds the in-process shop and its
// injected faults.
package main

import (
	"context"
	"encoding/json"
	"errors"
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

func main() {
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "checkout:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	out = demo.NewSyncWriter(out)
	tmp, err := os.MkdirTemp("", "idem-checkout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	journalPath, err := demo.JournalPath(tmp, "ops.db", *journalFlag)
	if err != nil {
		return err
	}

	shop, err := demo.StartShop(tmp)
	if err != nil {
		return err
	}
	defer shop.Close()
	fmt.Fprintf(out, "demo shop on %s, journal %s\n", shop.URL, journalPath)

	// The journal is where every operation is written, with its key and
	// its exact request, before anything is sent.
	journal, err := idem.OpenSQLite(journalPath)
	if err != nil {
		return err
	}
	defer journal.Close()
	client, err := newClient(journal, shop.URL, out)
	if err != nil {
		return err
	}
	defer client.Close()

	// 1. The answer is lost after the shop created the order.
	fmt.Fprintln(out, "\n1. Place order checkout/cart-42. The shop creates it, then the connection drops before the answer.")
	shop.DropAnswerOf(shop.OrderRequests() + 1) // the answer to the next order is lost
	res, err := client.Do(ctx, placeOrder("checkout/cart-42", "book", 1))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   → order %s, key %s, replayed: %t\n", demo.OrderID(res.Body), res.Key, res.Replayed)
	fmt.Fprintf(out, "     The shop saw %d POST /orders and %d status request: the status endpoint handed back the order it had created.\n",
		shop.OrderRequests(), shop.StatusRequests())
	firstKey := res.Key

	// 2. The same operation again: the journal answers, nothing is sent.
	// This is what a retry by your caller, a double click or a re-run of
	// the same code path gets.
	fmt.Fprintln(out, "\n2. Call Do again for checkout/cart-42.")
	before := shop.OrderRequests()
	res, err = client.Do(ctx, placeOrder("checkout/cart-42", "book", 1))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   → order %s, key %s, from the journal: POST /orders requests at the shop: %d before, %d after\n",
		demo.OrderID(res.Body), res.Key, before, shop.OrderRequests())
	if res.Key != firstKey {
		return fmt.Errorf("the second Do used key %s, not %s", res.Key, firstKey)
	}

	// 3. An order the shop refuses: a definitive answer, and an error.
	fmt.Fprintln(out, "\n3. Place order checkout/cart-44 for 0 lamps. The shop refuses it.")
	res, err = client.Do(ctx, placeOrder("checkout/cart-44", "lamp", 0))
	var refused *idem.OperationError
	if !errors.Is(err, idem.ErrRejected) || !errors.As(err, &refused) {
		return fmt.Errorf("checkout/cart-44: want ErrRejected, got %v", err)
	}
	fmt.Fprintf(out, "   → ErrRejected: HTTP %d, %s\n", refused.StatusCode, problemDetail(refused.Body))
	before = shop.OrderRequests()
	res, err = client.Do(ctx, placeOrder("checkout/cart-44", "lamp", 0))
	if !errors.Is(err, idem.ErrRejected) || !res.Journaled {
		return fmt.Errorf("checkout/cart-44 asked again: want ErrRejected from the journal, got %v", err)
	}
	fmt.Fprintf(out, "   Do again: ErrRejected from the journal, HTTP %d; POST /orders requests at the shop: %d before, %d after\n",
		res.StatusCode, before, shop.OrderRequests())

	// 4. A crash while an order is on the wire.
	fmt.Fprintln(out, "\n4. Place order checkout/cart-43. The shop creates it and holds the answer; meanwhile the process \"crashes\".")
	held := shop.HoldAnswerOf(shop.OrderRequests() + 1) // the next order's answer is held
	done := make(chan error, 1)
	go func() {
		_, err := client.Do(ctx, placeOrder("checkout/cart-43", "lamp", 2))
		done <- err
	}()
	select {
	case <-held:
	case err := <-done:
		return fmt.Errorf("checkout/cart-43 returned before the shop held its answer: %v", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	// Close interrupts the calls in progress, as a crash would; the
	// operation stays in the journal. (examples/resume kills a real
	// process instead.)
	client.Close()
	err = <-done
	if !errors.Is(err, idem.ErrOutcomeUnknown) {
		return fmt.Errorf("checkout/cart-43 after the crash: want ErrOutcomeUnknown, got %v", err)
	}
	fmt.Fprintln(out, "   Do returned ErrOutcomeUnknown: the request was sent, so the order may exist; the journal keeps the operation.")
	journal.Close()

	if err := restart(ctx, out, journalPath, shop); err != nil {
		return err
	}

	// 5. The shop's own count.
	n, err := shop.Orders(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n5. 2 orders placed, 1 refused: %d orders on the server.\n", n)
	if n != 2 {
		return fmt.Errorf("the shop holds %d orders for 2 orders placed", n)
	}
	// The CLI is a module of its own (cmd/idem), run from its directory:
	// the journal is named by its absolute path.
	if *journalFlag != "" {
		abs, err := filepath.Abs(journalPath)
		if err != nil {
			abs = journalPath
		}
		fmt.Fprintf(out, "\nThe journal is kept in %s; look at it with the operator CLI, from the repository's root:\n"+
			"   (cd cmd/idem && go run . --journal %s ls)\n   (cd cmd/idem && go run . --journal %s ui)\n", journalPath, abs, abs)
	} else {
		fmt.Fprint(out, "\nThe journal was temporary and is removed now. To keep it, and look at it with the operator CLI:\n"+
			"   go run ./examples/checkout -journal /tmp/ops.db\n   (cd cmd/idem && go run . --journal /tmp/ops.db ls)    (or ui, a web view)\n")
	}
	return nil
}

// restart is what a restarted process does: it opens the same journal file
// and calls Resume, which finishes whatever was left unfinished.
func restart(ctx context.Context, out io.Writer, journalPath string, shop *demo.Shop) error {
	fmt.Fprintln(out, "\n   Restart: a new client on the same journal file.")
	journal, err := idem.OpenSQLite(journalPath)
	if err != nil {
		return err
	}
	defer journal.Close()
	client, err := newClient(journal, shop.URL, out)
	if err != nil {
		return err
	}
	defer client.Close()
	rec, err := client.Lookup(ctx, "", "checkout/cart-43")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   journal: checkout/cart-43, key %s, state %s after %d attempt(s) (%s)\n", rec.Key, rec.State, rec.Attempts, rec.LastError)
	// An interrupted operation is due again at once. A real service calls
	// Resume at start-up and then every little while (an operation whose
	// server kept failing is due again only after a backoff).
	before, statusBefore := shop.OrderRequests(), shop.StatusRequests()
	rep, err := client.Resume(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   Resume: claimed %d, succeeded %d, rejected %d, still pending %d, still unknown %d, expired %d, failed %d\n",
		rep.Claimed, rep.Succeeded, rep.Rejected, rep.Pending, rep.Unknown, rep.Expired, rep.Failed)
	if rec, err = client.Lookup(ctx, "", "checkout/cart-43"); err != nil {
		return err
	}
	if rec.State != idem.StateSucceeded || rec.Response == nil {
		return fmt.Errorf("checkout/cart-43 is %s after Resume: %s", rec.State, rec.LastError)
	}
	fmt.Fprintf(out, "   → order %s, key %s; Resume asked the status endpoint (%d status request) and sent %d POST /orders\n",
		demo.OrderID(rec.Response.Body), rec.Key, shop.StatusRequests()-statusBefore, shop.OrderRequests()-before)
	return nil
}

// newClient is the client configuration an application would use.
func newClient(journal idem.Journal, baseURL string, out io.Writer) (*idem.Client, error) {
	return idem.New(idem.Config{
		Journal: journal,
		BaseURL: baseURL,
		// When an answer is lost, ask the shop what became of the key
		// (GET /idempotency/{key}) instead of guessing. Without a status
		// endpoint, the default re-sends the same key and bytes, which is
		// safe with servers that keep keys (Stripe and most middlewares).
		Status: idem.StatusEndpoint(baseURL + "/idempotency"),
		// An attempt, or a status check, whose answer does not come within
		// 5 s is given up and its outcome checked. It must outlast the
		// server's processing time; the default is 30 s.
		AttemptTimeout: 5 * time.Second,
		// Every journaled state change, for logs, metrics or tracing.
		OnTransition: demo.PrintTransitions(out),
	})
}

// placeOrder is the logical operation "place the order of this cart". Its
// ID names the operation, not the attempt: every retry, and every run after
// a restart, uses the same ID and so the same key.
func placeOrder(id, item string, quantity int) idem.Op {
	body, _ := json.Marshal(map[string]any{"item": item, "quantity": quantity})
	return idem.Op{
		ID:     id,
		Method: "POST",
		URL:    "/orders",
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   body,
	}
}

// problemDetail is the detail of an RFC 9457 problem, or the body itself.
func problemDetail(body []byte) string {
	var p struct {
		Detail string `json:"detail"`
	}
	if json.Unmarshal(body, &p) != nil || p.Detail == "" {
		return string(body)
	}
	return p.Detail
}
