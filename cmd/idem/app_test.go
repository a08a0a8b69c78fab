package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
)

// appEnv names the application a child process of the test binary plays
// (see TestMain): the journals the CLI is tested on are written by the
// real client, in a process of their own when the test needs that process
// to die holding its leases.
const appEnv = "IDEM_CLI_TEST_APP"

// apps are the applications a child can play. Each reads its settings
// from the environment and returns the exit status.
var apps = map[string]func() error{
	"story": storyApp,
}

func runApp(name string) int {
	app := apps[name]
	if app == nil {
		fmt.Fprintf(os.Stderr, "no application %q\n", name)
		return 2
	}
	if err := app(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// startApp starts a child process that plays the application name, with
// env added to its environment.
func startApp(t *testing.T, name string, env ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(childEnv(), append(env, appEnv+"="+name)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, &out
}

// storyApp is an application named pod-1 that sends one order to
// $IDEM_TEST_BASE_URL, with the status endpoint $IDEM_TEST_BASE_URL/status,
// journaling in $IDEM_TEST_JOURNAL (see storyJournal). The story server (see
// TestShowTellsTheStory) makes its call go on until the test kills it.
func storyApp() error {
	base := os.Getenv("IDEM_TEST_BASE_URL")
	j, err := storyJournal()
	if err != nil {
		return err
	}
	defer j.Close()
	// An hour's lease: when the test kills it, only its owner being
	// gone, never the lease lapsing, lets another take the operation.
	// $IDEM_TEST_LEASE sets another, for a test that stops it until its
	// lease lapses.
	lease := time.Hour
	if v := os.Getenv("IDEM_TEST_LEASE"); v != "" {
		if lease, err = time.ParseDuration(v); err != nil {
			return err
		}
	}
	c, err := idem.New(idem.Config{Journal: j, Owner: "pod-1", BaseURL: base, LeaseDuration: lease,
		Status: idem.StatusEndpoint(base + "/status"),
		Retry:  idem.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Do(context.Background(), idem.Op{ID: "checkout/cart-42", Method: "POST", URL: "/orders",
		Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"cart":42}`)})
	return fmt.Errorf("the call returned, the test should have killed it first: %v", err)
}

// storyJournal opens the SQLite journal at $IDEM_TEST_JOURNAL or, when
// $IDEM_TEST_SCHEMA is set, the PostgreSQL journal in that schema of the
// test server, with no liveness when $IDEM_TEST_NO_LIVENESS is set.
func storyJournal() (idem.Journal, error) {
	schema := os.Getenv("IDEM_TEST_SCHEMA")
	if schema == "" {
		return idem.OpenSQLite(os.Getenv("IDEM_TEST_JOURNAL"))
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testDSN())
	if err != nil {
		return nil, err
	}
	opts := []postgres.Option{postgres.Schema(schema)}
	if os.Getenv("IDEM_TEST_NO_LIVENESS") != "" {
		opts = append(opts, postgres.WithoutLiveness())
	}
	j, err := postgres.OpenJournal(ctx, pool, opts...)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return j, nil // the pool ends with the process
}
