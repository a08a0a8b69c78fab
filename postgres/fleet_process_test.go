package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// The environment of a "worker" child process.
const (
	workerOwnerEnv  = "IDEM_WORKER_OWNER"
	workerServerEnv = "IDEM_WORKER_SERVER" // the orders server's base URL
	workerLeaseEnv  = "IDEM_WORKER_LEASE"  // Config.LeaseDuration
)

func init() { children["worker"] = workerMain }

// workerMain is one worker of a fleet: it opens the shared journal on a
// pool of its own and finishes whatever is unfinished (its own work, and
// that of workers that died) until nothing is left, as examples/fleet's
// workers do.
func workerMain() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	lease, err := time.ParseDuration(os.Getenv(workerLeaseEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", workerLeaseEnv, err)
	}
	j, closeJournal, err := openChildJournal(ctx)
	if err != nil {
		return err
	}
	defer closeJournal()
	c, err := newFleetClient(j, os.Getenv(workerServerEnv), os.Getenv(workerOwnerEnv), lease)
	if err != nil {
		return err
	}
	defer c.Close()
	rep, err := c.Resume(ctx, idem.ResumeWait())
	fmt.Printf("%+v\n", rep)
	return err
}

// newFleetClient is the client of every process of the fleet.
func newFleetClient(j idem.Journal, base, owner string, lease time.Duration) (*idem.Client, error) {
	return idem.New(idem.Config{
		Journal:           j,
		BaseURL:           base,
		Status:            idem.StatusEndpoint(base + "/idempotency"),
		Owner:             owner,
		LeaseDuration:     lease,
		ResumeConcurrency: 2,
		// A held answer is given up on after this, and asked for.
		AttemptTimeout: 2 * time.Second,
	})
}

// TestFleetOfWorkerProcesses: four worker processes share one journal and
// forty operations; the server holds some answers; worker-1 is SIGKILLed
// while operations it leased are on the wire. The three others take them
// over (within the journal's LivenessGrace while liveness is on; once their
// leases lapse when it is off) and finish everything: the server ran its handler once per
// operation and holds one order for each.
func TestFleetOfWorkerProcesses(t *testing.T) {
	for _, tc := range []struct {
		name     string
		liveness bool
		lease    time.Duration
	}{
		{"liveness", true, 30 * time.Second},
		{"without liveness", false, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) { testFleet(t, tc.liveness, tc.lease) })
	}
}

func testFleet(t *testing.T, liveness bool, lease time.Duration) {
	const operations = 40
	srv := testserver.Start(t)
	schema := pgtest.Schema(t)
	var opts []postgres.Option
	if !liveness {
		opts = append(opts, postgres.WithoutLiveness())
	}
	j, err := postgres.OpenJournal(ctx, pgtest.Pool(t), append(opts, postgres.Schema(schema))...)
	require.NoError(t, err)
	defer j.Close()

	// Enqueue: journaled with their keys, not sent.
	app, err := newFleetClient(j, srv.URL, "enqueuer", lease)
	require.NoError(t, err)
	for i := range operations {
		body, _ := json.Marshal(map[string]any{"item": "book", "quantity": i + 1})
		_, err := app.Begin(ctx, idem.Op{ID: fmt.Sprintf("order-%02d", i), Method: http.MethodPost, URL: "/orders",
			Header: http.Header{"Content-Type": {"application/json"}}, Body: body})
		require.NoError(t, err)
	}
	require.NoError(t, app.Close())
	// The first eight requests to reach the server get their orders created
	// and their answers held until the client gives up.
	srv.InjectN(testserver.HoldPastTimeout, 8)

	env := func(owner string) []string {
		return append(childJournalEnv(schema, liveness), workerOwnerEnv+"="+owner, workerServerEnv+"="+srv.URL,
			workerLeaseEnv+"="+lease.String())
	}
	workers := make([]*childProc, 4)
	for i := range workers {
		name := fmt.Sprintf("worker-%d", i+1)
		workers[i] = startChild(t, "worker", name, nil, env(name)...)
	}

	// Kill worker-1 with operations of its own on the wire.
	ops := pgschema.Ident(schema) + ".operations"
	type leased struct {
		key     string
		expires int64
	}
	var mine []leased
	// An operation in flight for 100 ms has its answer held (a quick one
	// is answered in a millisecond or two): worker-1 is then sure to die
	// with it on the wire, whatever it does in between.
	deadline := time.Now().Add(time.Minute)
	inFlightSince := map[string]time.Time{}
	for {
		rows, err := pgtest.Pool(t).Query(ctx, `SELECT key FROM `+ops+
			` WHERE lease_owner LIKE 'worker-1#%' AND state = $1`, int16(idem.StateInFlight))
		require.NoError(t, err)
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		held, now := false, time.Now()
		seen := map[string]time.Time{}
		for _, k := range keys {
			since, ok := inFlightSince[k]
			if !ok {
				since = now
			}
			seen[k] = since
			held = held || now.Sub(since) >= 100*time.Millisecond
		}
		inFlightSince = seen
		if held {
			break
		}
		select {
		case <-workers[0].waited:
			t.Fatalf("worker-1 exited before it sent anything: %v\n%s", workers[0].err, workers[0].stderr)
		default:
		}
		require.True(t, time.Now().Before(deadline), "worker-1 sent nothing in a minute")
		time.Sleep(5 * time.Millisecond)
	}
	killed := time.Now()
	workers[0].kill()
	rows, err := pgtest.Pool(t).Query(ctx, `SELECT key, lease_expires_at FROM `+ops+
		` WHERE lease_owner LIKE 'worker-1#%' AND state IN (1, 2, 3)`)
	require.NoError(t, err)
	for rows.Next() {
		var l leased
		require.NoError(t, rows.Scan(&l.key, &l.expires))
		mine = append(mine, l)
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, mine, "worker-1 died holding operations")
	t.Logf("worker-1 was SIGKILLed holding %d operation(s)", len(mine))

	for _, w := range workers[1:] {
		select {
		case <-w.waited:
			require.NoError(t, w.err, "%s: %s", w.name, w.stderr)
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s did not finish in two minutes", w.name)
		}
	}

	counts, err := j.Count(ctx)
	require.NoError(t, err)
	require.Len(t, counts, 1, "every operation is in one state: %v", counts)
	assert.Equal(t, idem.StateSucceeded, counts[0].State)
	assert.Equal(t, operations, counts[0].N)
	assert.Equal(t, operations, srv.TotalOrders(), "one order per operation")
	assert.Equal(t, operations, srv.Executions(), "the handler ran once per operation")
	assert.Zero(t, srv.GuardedDuplicates(), "no second run needed the application's guard")

	var slowest time.Duration
	for _, l := range mine {
		evs, err := j.History(ctx, l.key)
		require.NoError(t, err)
		var took *idem.Event
		for i := range evs {
			if evs[i].Kind == idem.EventClaim && strings.Contains(evs[i].Detail, "taken over from worker-1#") {
				took = &evs[i]
			}
		}
		require.NotNil(t, took, "worker-1's %s was taken over: %v", l.key, evs)
		assert.Regexp(t, `^worker-[234]#`, took.Owner)
		expires := time.UnixMilli(l.expires)
		if liveness {
			assert.Contains(t, took.Detail, "its owner is gone")
			assert.True(t, took.At.Before(expires), "taken at %v, before worker-1's lease would have lapsed at %v", took.At, expires)
		} else {
			assert.Contains(t, took.Detail, "its lease lapsed")
			assert.False(t, took.At.Before(expires), "taken at %v, not before worker-1's lease lapsed at %v", took.At, expires)
		}
		slowest = max(slowest, took.At.Sub(killed))
	}
	t.Logf("worker-1's operations were all taken over within %v of the kill; %d orders, %d handler runs, %d status requests",
		slowest.Round(time.Millisecond), srv.TotalOrders(), srv.Executions(), srv.StatusRequests())
}
