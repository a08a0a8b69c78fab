// Command ordersd runs the orders application behind the idem server
// middleware, with every piece of state on disk (an SQLite key store and an
// SQLite orders database), for crash tests that SIGKILL it and start it
// again on the same files.
//
//	ordersd -addr 127.0.0.1:0 -store keys.db -orders orders.db
//
// It prints "listening http://ADDR" on stdout once it accepts connections,
// and shuts down gracefully on SIGTERM or SIGINT. POST /orders creates an
// order (X-Tenant selects the tenant); GET /idempotency/{key} is the status
// endpoint.
//
// -delay-before holds each request after its key is claimed and before the
// order is created; -delay-after holds it after the order is committed and
// before the middleware stores the response. A SIGKILL during either leaves
// an in-progress entry whose lock goes stale after -lock-timeout; during
// -delay-after it also leaves an order that the retry finds through the
// application's UNIQUE guard.
//
// -jitter-before and -jitter-after add a random hold, drawn per request
// from 0 to that long, to the two delays; -seed seeds it, so that a crash
// test can name its run.
//
// -key-header makes the middleware take the key from that header only;
// -key-quoted refuses a key that is not an RFC 8941 sf-string;
// -tenant-tokens a=tokA,b=tokB refuses a request (order or status) without
// "Authorization: Bearer" and the token of its X-Tenant. A request with
// the key in another header or form is refused with 400, one with another
// tenant's token (or none) with 403, before the middleware sees it; -audit
// FILE appends one line per request checked, saying what was wrong:
//
//	POST orders tenant-a header=ok token=ok
//	POST orders tenant-b header=other:Idempotency-Key token=of:tenant-a
//
// -exec-log FILE appends, on a file shared by every life, one line before
// and one after each run of the orders handler, and one once the response
// of a request that ran it was sent, so that a crash test counts the runs
// of each key across lives:
//
//	run tenant-a 3f1c…
//	done tenant-a 3f1c… 201
//	answered tenant-a 3f1c…
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemkit/idem/internal/testserver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := testserver.Daemon(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ordersd:", err)
		os.Exit(1)
	}
}
