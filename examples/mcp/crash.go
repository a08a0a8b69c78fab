package main

// The runtime as a child process (package child starts and kills it).

import (
	"context"
	"fmt"
	"os"
)

// Environment of the child process.
const (
	runtimeEnv = "IDEM_EXAMPLE_MCP_RUNTIME" // "1": run the runtime, not the demo
	journalEnv = "IDEM_EXAMPLE_MCP_JOURNAL"
	serverEnv  = "IDEM_EXAMPLE_MCP_SERVER"
)

func isRuntime() bool { return os.Getenv(runtimeEnv) == "1" }

// runtimeMain is the child: it runs the transcript, and is killed in the
// middle of its last tool call.
func runtimeMain(ctx context.Context) error {
	rt, err := openRuntime(os.Getenv(journalEnv), os.Getenv(serverEnv), os.Stdout)
	if err != nil {
		return err
	}
	defer rt.Close()
	for i, step := range transcript {
		fmt.Printf("step %d:\n", i+1)
		if err := rt.runStep(ctx, step); err != nil {
			return err
		}
	}
	fmt.Println("the transcript is done")
	return nil
}
