package main

// The application as a child process (package child starts and kills it).

import (
	"context"
	"fmt"
	"os"

	"github.com/idemkit/idem"
)

// Environment of the child process.
const (
	appEnv     = "IDEM_EXAMPLE_STRIPE_APP" // "1": run the application, not the demo
	journalEnv = "IDEM_EXAMPLE_STRIPE_JOURNAL"
	apiEnv     = "IDEM_EXAMPLE_STRIPE_API"
)

func isApplication() bool { return os.Getenv(appEnv) == "1" }

// applicationMain is the child: it pays invoice-8, and is killed before
// the answer comes.
func applicationMain(ctx context.Context) error {
	j, err := idem.OpenSQLite(os.Getenv(journalEnv))
	if err != nil {
		return err
	}
	defer j.Close()
	c, err := newIdem(j, os.Getenv(apiEnv))
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("paying invoice-8")
	pi, err := pay(ctx, c, os.Getenv(apiEnv), "invoice-8", 3000)
	if err != nil {
		return err
	}
	fmt.Println("paid", pi.ID)
	return nil
}
