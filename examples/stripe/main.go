// Stripe shows stripe-go, unchanged, paying through idem: each payment is
// one idem operation, journaled with its key before it is sent, so that a
// lost answer or a crashed process never becomes a second PaymentIntent.
//
// Three lines of the application change (see pay): stripe-go gets idem's
// *http.Client in its BackendConfig, and the context of each call names
// the logical payment. stripe-go puts an Idempotency-Key of its own on
// every call, a new one each time; idem replaces it with the operation's
// journaled key, the same on every attempt, after a restart too.
//
// The program runs against a fake Stripe API (fake_stripe.go: POST
// /v1/payment_intents, form-encoded, behind idem's server middleware,
// which replays stored answers as Stripe does) and shows:
//
//  1. a lost answer: the API creates the PaymentIntent and the connection
//     dies; idem re-sends the same key and bytes, and the API replays its
//     answer;
//
//  2. a crash: the application, a process of its own, is killed with
//     SIGKILL while its payment is on the wire; after the restart, Resume
//     finishes it from the journal, and the application's own retry of the
//     payment (a new stripe-go call, with a new key of stripe-go's) gets
//     the same PaymentIntent without sending anything.
//
//     cd examples/stripe && go run .
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/stripe/stripe-go/v82"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/child"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	if isApplication() {
		err = applicationMain(ctx) // the process the demo kills: see crash.go
	} else {
		err = run(ctx, os.Stdout)
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// newIdem is the application's idem client. Authorize gives Resume, after
// a restart, the credentials stripe-go gave each call before it: they are
// never journaled.
func newIdem(journal idem.Journal, apiURL string) (*idem.Client, error) {
	return idem.New(idem.Config{
		Journal: journal,
		BaseURL: apiURL,
		Authorize: func(r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+secretKey)
			return nil
		},
		// Stripe has no status endpoint: an unknown outcome is settled by
		// sending the same key again, which Stripe answers from its store.
		Status: idem.ReplayStatus(),
	})
}

// pay is the application's code for one payment. The lines marked idem are
// the ones that change.
func pay(ctx context.Context, c *idem.Client, apiURL, invoice string, amount int64) (*stripe.PaymentIntent, error) {
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		HTTPClient:    c.StandardClient(), // idem
		URL:           stripe.String(apiURL),
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
		// idem retries, with the operation's key; stripe-go's own retries
		// would be safe (each continues the same operation) but redundant.
		MaxNetworkRetries: stripe.Int64(0),
	})
	sc := stripe.NewClient(secretKey, stripe.WithBackends(&stripe.Backends{API: backend}))
	ctx = idem.WithOperation(ctx, "pay/"+invoice) // idem: one operation per logical payment
	params := &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(amount), Currency: stripe.String("eur")}
	params.AddMetadata("invoice", invoice)
	return sc.V1PaymentIntents.Create(ctx, params)
}

func run(ctx context.Context, out io.Writer) error {
	api, err := startFakeStripe()
	if err != nil {
		return err
	}
	defer api.Close()
	dir, err := os.MkdirTemp("", "idem-stripe")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "payments.db")
	j, err := idem.OpenSQLite(path)
	if err != nil {
		return err
	}
	defer j.Close()
	c, err := newIdem(j, api.URL)
	if err != nil {
		return err
	}
	defer c.Close()

	fmt.Fprintln(out, "1. The answer to invoice-7's payment is lost after Stripe created the PaymentIntent.")
	api.loseNextAnswer()
	pi, err := pay(ctx, c, api.URL, "invoice-7", 2000)
	if err != nil {
		return fmt.Errorf("paying invoice-7: %w", err)
	}
	fmt.Fprintf(out, "   invoice-7 paid: %s, %d %s (Idempotent-Replayed: %s)\n", pi.ID, pi.Amount, pi.Currency,
		pi.LastResponse.Header.Get("Idempotent-Replayed"))

	fmt.Fprintln(out, "2. The application pays invoice-8 and is killed (SIGKILL) while the payment is on the wire.")
	api.holdNextAnswer()
	app, err := child.Start(out, appEnv+"=1", journalEnv+"="+path, apiEnv+"="+api.URL)
	if err != nil {
		return err
	}
	defer app.Kill()
	// The API created invoice-8's PaymentIntent, and holds the answer.
	for created := ""; created != "pi_2"; {
		select {
		case created = <-api.created:
		case <-app.Exited():
			return fmt.Errorf("the application exited before the crash: %v", app.Err())
		case <-time.After(time.Minute):
			return errors.New("the application's payment never reached the API")
		}
	}
	fmt.Fprintln(out, "   "+app.Kill())
	rec, err := c.Lookup(ctx, "", "pay/invoice-8")
	if err != nil {
		return err
	}
	credential := "no credential"
	if rec.Header.Get("Authorization") != "" {
		credential = "a credential!"
	}
	fmt.Fprintf(out, "   the journal: pay/invoice-8 is %s, key %s…, stripe-go's headers with %s\n", rec.State, rec.Key[:8], credential)

	fmt.Fprintln(out, "3. After the restart, Resume finishes it with the journaled key and bytes.")
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rep, err := c.Resume(rctx, idem.ResumeWait())
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   Resume: claimed %d, succeeded %d, unknown %d\n", rep.Claimed, rep.Succeeded, rep.Unknown)
	_, posts, _ := api.counts()
	pi, err = pay(ctx, c, api.URL, "invoice-8", 3000) // the application retries the payment
	if err != nil {
		return fmt.Errorf("paying invoice-8: %w", err)
	}
	_, after, _ := api.counts()
	fmt.Fprintf(out, "   invoice-8 paid: %s, %d %s (%d request(s) sent for it now: the journal answered)\n",
		pi.ID, pi.Amount, pi.Currency, after-posts)

	intents, posts, keys := api.counts()
	fmt.Fprintf(out, "2 payments, %d PaymentIntents; Stripe saw %d POSTs carrying %d distinct keys.\n", intents, posts, keys)
	if intents != 2 || keys != 2 {
		return fmt.Errorf("expected 2 PaymentIntents under 2 keys, got %d under %d", intents, keys)
	}
	return nil
}
