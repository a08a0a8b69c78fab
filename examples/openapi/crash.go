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
	appEnv     = "IDEM_EXAMPLE_OPENAPI_APP" // "1": run the application, not the demo
	journalEnv = "IDEM_EXAMPLE_OPENAPI_JOURNAL"
	apiEnv     = "IDEM_EXAMPLE_OPENAPI_API"
)

func isApplication() bool { return os.Getenv(appEnv) == "1" }

// applicationMain is the child: it places cart-2's order, and is killed
// before the answer comes.
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
	fmt.Println("placing cart-2")
	o, err := place(ctx, c, os.Getenv(apiEnv), "cart-2", 2)
	if err != nil {
		return err
	}
	fmt.Println("placed", o.OrderId)
	return nil
}
