// Fleet shows workers that share one PostgreSQL journal and take over each
// other's work when one of them dies.
//
// The program enqueues twelve orders in the journal (Begin: journaled with
// their keys, not sent), then starts worker-1, a process of its own that
// resumes the fleet's work. The demo shop creates worker-1's first four
// orders and holds their answers; at that moment the program kills worker-1
// with SIGKILL. Then worker-2 and worker-3 start on the same journal: the
// journal sees that worker-1's session is gone, so they take its four
// operations over within the journal's LivenessGrace (two seconds; no
// lease to wait out), ask the shop's status
// endpoint what became of them, and send the other eight. At the end the
// program prints, from the journal's history, who finished what and why,
// and the shop's count: twelve orders for twelve operations.
//
//	cd examples/fleet && go run .      # IDEM_POSTGRES names the database
//
// Start from this program when a service runs as several replicas or a pool
// of workers: runWorker is the code each of them runs (open the shared
// journal, New, Resume). worker.go starts and kills the processes, and
// examples/internal/demo holds the shop: both are demo scaffolding.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/demo"
	"github.com/idemkit/idem/postgres"
)

// defaultDSN is the database every machine of this project runs.
const defaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

const orders = 12

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	if isWorker() {
		err = workerMain(ctx) // a worker process: see worker.go
	} else {
		err = run(ctx, os.Stdout)
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func dsn() string {
	if v := os.Getenv("IDEM_POSTGRES"); v != "" {
		return v
	}
	return defaultDSN
}

// run is the demo: the shop, the queue of orders, the workers, the tally.
func run(ctx context.Context, out io.Writer) error {
	out = &syncWriter{out: out} // the workers' output is relayed to it concurrently
	pool, err := pgxpool.New(ctx, dsn())
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("PostgreSQL at %s: %w (set IDEM_POSTGRES)", dsn(), err)
	}
	// A schema of the demo's own, dropped at the end: a real fleet names
	// one schema for good (postgres.Schema).
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "idem_fleet_demo_" + hex.EncodeToString(b[:])
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")

	dir, err := os.MkdirTemp("", "idem-fleet")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	shop, err := demo.StartShop(dir)
	if err != nil {
		return err
	}
	defer shop.Close()
	fmt.Fprintf(out, "demo shop on %s, journal in PostgreSQL schema %s\n", shop.URL, schema)

	journal, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema))
	if err != nil {
		return err
	}
	defer journal.Close()

	// 1. The application enqueues the orders: journaled, not sent.
	fmt.Fprintf(out, "\n1. Enqueue %d orders: each is journaled with its key (Begin), none is sent.\n", orders)
	app, err := newClient(journal, shop.URL, "enqueuer")
	if err != nil {
		return err
	}
	for i := 1; i <= orders; i++ {
		if _, err := app.Begin(ctx, placeOrder(i)); err != nil {
			return err
		}
	}
	if err := app.Close(); err != nil {
		return err
	}

	// 2. worker-1 takes up four of them; the shop creates those orders and
	// holds the answers; worker-1 is killed with the four on the wire.
	fmt.Fprintln(out, "\n2. Start worker-1. The shop creates its first 4 orders and holds the answers; then worker-1 is killed.")
	held := make([]<-chan struct{}, 4)
	for i := range held {
		held[i] = shop.HoldAnswerOf(i + 1)
	}
	w1, err := startWorker(ctx, out, "worker-1", schema, shop.URL)
	if err != nil {
		return err
	}
	for _, h := range held {
		select {
		case <-h:
		case <-w1.exited:
			return fmt.Errorf("worker-1 exited before the shop held its orders: %v\n%s", w1.waitErr, w1.stderr.String())
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	fmt.Fprintf(out, "   %s\n", w1.Kill())

	// 3. worker-2 and worker-3 finish the work, worker-1's included.
	fmt.Fprintln(out, "\n3. Start worker-2 and worker-3 on the same journal.")
	var workers []*worker
	for _, name := range []string{"worker-2", "worker-3"} {
		w, err := startWorker(ctx, out, name, schema, shop.URL)
		if err != nil {
			return err
		}
		workers = append(workers, w)
	}
	for _, w := range workers {
		if err := w.Wait(ctx); err != nil {
			return err
		}
	}

	// 4. Who finished what, from the journal's history.
	fmt.Fprintln(out, "\n4. The journal's history: who finished each order, and how.")
	for i := 1; i <= orders; i++ {
		line, err := story(ctx, journal, orderID(i))
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "   %s\n", line)
	}
	n, err := shop.Orders(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n5. %d operations, %d orders on the server.\n", orders, n)
	if n != orders {
		return fmt.Errorf("the shop holds %d orders for %d operations", n, orders)
	}
	return nil
}

// runWorker is what every worker of the fleet runs: open the shared
// journal on a pool of its own, and finish whatever is unfinished, its
// own work and that of workers that died, until nothing is left.
func runWorker(ctx context.Context, out io.Writer, name, schema, shopURL string) error {
	pool, err := pgxpool.New(ctx, dsn())
	if err != nil {
		return err
	}
	defer pool.Close()
	journal, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema))
	if err != nil {
		return err
	}
	defer journal.Close()
	client, err := newClient(journal, shopURL, name)
	if err != nil {
		return err
	}
	defer client.Close()
	rep, err := client.Resume(ctx, idem.ResumeWait())
	fmt.Fprintf(out, "%s: took up %d operation(s): %d succeeded, %d left\n", name, rep.Claimed, rep.Succeeded, rep.Remaining())
	return err
}

// newClient is the client every process of the fleet uses.
func newClient(journal idem.Journal, shopURL, owner string) (*idem.Client, error) {
	return idem.New(idem.Config{
		Journal: journal,
		BaseURL: shopURL,
		Status:  idem.StatusEndpoint(shopURL + "/idempotency"),
		// The history names who did what.
		Owner: owner,
		// Take up at most four operations at a time.
		ResumeConcurrency: 4,
		AttemptTimeout:    5 * time.Second,
	})
}

func orderID(i int) string { return fmt.Sprintf("orders/%02d", i) }

// placeOrder is the logical operation "place order i".
func placeOrder(i int) idem.Op {
	body, _ := json.Marshal(map[string]any{"item": "book", "quantity": i})
	return idem.Op{ID: orderID(i), Method: "POST", URL: "/orders",
		Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
}

// story tells who finished an operation, from its history: who sent it
// last, whether it was taken over and from whom, and how it ended.
func story(ctx context.Context, j idem.Journal, id string) (string, error) {
	rec, err := j.Lookup(ctx, "default", id)
	if err != nil {
		return "", err
	}
	if rec.State != idem.StateSucceeded {
		return "", fmt.Errorf("%s is %s: %s", id, rec.State, rec.LastError)
	}
	h, err := j.History(ctx, rec.Key)
	if err != nil {
		return "", err
	}
	var took []string
	for _, e := range h {
		if e.Kind == idem.EventClaim && strings.HasPrefix(e.Detail, "taken over from ") {
			took = append(took, fmt.Sprintf("%s took it over (%s)", ownerName(e.Owner), e.Detail))
		}
	}
	last := h[len(h)-1]
	how := "the shop answered"
	if last.Kind == idem.EventStatus {
		how = "the status endpoint said"
	}
	line := fmt.Sprintf("%s: %s finished it, %s HTTP %d (order %s)", id, ownerName(last.Owner), how,
		rec.Response.StatusCode, demo.OrderID(rec.Response.Body))
	if len(took) > 0 {
		line += "; " + strings.Join(took, "; ")
	}
	return line, nil
}

// ownerName is an owner without the suffix the client adds.
func ownerName(owner string) string {
	name, _, _ := strings.Cut(owner, "#")
	return name
}
