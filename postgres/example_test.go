package postgres_test

import (
	"context"
	"errors"
	"log"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/server/orders"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/server"
)

// A worker of a fleet: its own pool, the shared journal, and Resume at
// start-up to finish what workers that died left behind.
func ExampleOpenJournal() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	journal, err := postgres.OpenJournal(ctx, pool, postgres.Schema("idem"))
	if err != nil {
		log.Fatal(err)
	}
	defer journal.Close()
	client, err := idem.New(idem.Config{
		Journal: journal,
		BaseURL: "https://api.example.com",
		Status:  idem.StatusEndpoint("https://api.example.com/idempotency"),
		Owner:   "worker-1",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	report, err := client.Resume(ctx)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("resumed %d operations, %d left", report.Claimed, report.Remaining())
}

// One replica of an API whose replicas share their keys in PostgreSQL.
func ExampleOpenStore() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://api@db.internal:5432/api")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := postgres.OpenStore(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	mw, err := server.New(server.Config{Store: store, Scope: orders.Tenant})
	if err != nil {
		log.Fatal(err)
	}
	defer mw.Close()
	app, err := orders.New("orders.db")
	if err != nil {
		log.Fatal(err)
	}
	defer app.Close()
	log.Fatal(http.ListenAndServe(":8080", orders.Mux(app, mw)))
}

// A Do whose journal write was sent, lost its answer, and could not be read
// back, the database being out of reach: the operation may be journaled,
// and nothing was sent. The same Do later (the same client) takes it up.
func ExampleErrCommitInDoubt() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	journal, err := postgres.OpenJournal(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	defer journal.Close()
	client, err := idem.New(idem.Config{Journal: journal, BaseURL: "https://api.example.com"})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	op := idem.Op{ID: "invoice-7/pay", Method: http.MethodPost, URL: "/payments", Body: []byte(`{"invoice":7}`)}
	res, err := client.Do(ctx, op)
	if errors.Is(err, postgres.ErrCommitInDoubt) {
		log.Printf("the journal is out of reach: %v; trying again later", err)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("paid: HTTP %d", res.StatusCode)
}

// A worker whose way to the database is unreliable (another region, a
// flaky link): a blip that ends its liveness session and keeps it from
// reconnecting for a while must not cost it the operations it drives, so
// the grace is longer than such blips last. The pool checks each
// connection before use, so that the first statements after a blip or a
// restart of the database do not fail on dead connections. A worker that
// dies is then taken over a minute later, still long before its leases
// would lapse. Every worker of the fleet opens its journal with the same
// grace: the one that counts is that of the journal judging.
func ExampleLivenessGrace() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig("postgres://app@db.internal:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true }
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	journal, err := postgres.OpenJournal(ctx, pool, postgres.LivenessGrace(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	defer journal.Close()
	client, err := idem.New(idem.Config{
		Journal:       journal,
		BaseURL:       "https://api.example.com",
		Status:        idem.StatusEndpoint("https://api.example.com/idempotency"),
		LeaseDuration: 5 * time.Minute,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
}
