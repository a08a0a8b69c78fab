package main

import (
	"context"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// An operator's reconcile of an operation that a live process (a real
// one, in its status check) is driving is refused, saying whom it waits
// for and until when, and changes nothing: while the process runs, while
// it is stopped (SIGSTOP: alive, its lock file held), and up to the moment
// it settles the operation itself, after which the reconcile is refused
// as an illegal transition and the worker's outcome stays.
func TestReconcileWhileAWorkerProcessDrivesIt(t *testing.T) {
	t.Parallel()
	srv, path, rec, app, exited := holdingTheLease(t)
	until := "being driven by " + rec.Lease.Owner + " until " + rec.Lease.ExpiresAt.UTC().Format(time.RFC3339)
	reconcile := func() result {
		return idemOn(t, path, "reconcile", rec.Key, "--as", "rejected", "--note", "no order 42 in the ERP")
	}

	before := takeSnapshot(t, path)
	requireOneLineError(t, reconcile(), exitError, until)
	assert.Equal(t, before, takeSnapshot(t, path), "a refused reconcile wrote")

	require.NoError(t, app.Process.Signal(syscall.SIGSTOP))
	requireOneLineError(t, reconcile(), exitError, until)
	assert.Equal(t, before, takeSnapshot(t, path), "a refused reconcile wrote")
	require.NoError(t, app.Process.Signal(syscall.SIGCONT))

	// The worker settles it while the operator tries: every try is
	// refused, as leased first, then as settled.
	srv.letGo()
	for {
		r := reconcile()
		require.Equal(t, exitError, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
		if strings.Contains(r.stderr, "being driven by pod-1") {
			continue
		}
		requireOneLineError(t, r, exitError, "is succeeded; only unknown or expired operations are reconciled")
		break
	}
	<-exited
	got := getRecord(t, path, rec.Key)
	assert.Equal(t, idem.StateSucceeded, got.State)
	assert.Empty(t, got.Note, "the worker's outcome was overwritten")
	require.NotNil(t, got.Response)
}

// On a PostgreSQL journal, the same with a real worker process: refused
// while it runs and while it is stopped (its session holds its liveness
// lock), nothing written; once it is killed, the reconcile goes through
// as soon as the journal sees it gone (LivenessGrace), an hour before its
// lease would lapse.
func TestPostgresReconcileWhileAWorkerProcessDrivesIt(t *testing.T) {
	t.Parallel()
	schema, j := pgJournal(t)
	_, rec, app, exited := storyHolding(t, func() idem.Journal { return j }, "IDEM_TEST_SCHEMA="+schema)
	until := "being driven by " + rec.Lease.Owner + " until " + rec.Lease.ExpiresAt.UTC().Format(time.RFC3339)
	reconcile := func() result {
		return idemOnPG(t, schema, "reconcile", rec.Key, "--as", "rejected", "--note", "no order 42 in the ERP")
	}

	r := idemOnPG(t, schema, "stats")
	requireOK(t, r)
	assert.Regexp(t, `(?m)^  `+regexp.QuoteMeta(rec.Lease.Owner)+` +alive +1 +`, r.stdout)
	before := pgSnapshot(t, schema)
	requireOneLineError(t, reconcile(), exitError, until)
	assert.Equal(t, before, pgSnapshot(t, schema), "a refused reconcile wrote")

	require.NoError(t, app.Process.Signal(syscall.SIGSTOP))
	requireOneLineError(t, reconcile(), exitError, until)
	assert.Equal(t, before, pgSnapshot(t, schema), "a refused reconcile wrote")

	require.NoError(t, app.Process.Kill())
	<-exited
	for {
		r := reconcile()
		if r.code == exitOK {
			assert.Equal(t, "reconciled "+rec.Key+" (default/checkout/cart-42) as rejected, was unknown\n", r.stdout)
			break
		}
		requireOneLineError(t, r, exitError, until) // within LivenessGrace of its death
	}
	got, err := j.Get(context.Background(), rec.Key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateRejected, got.State)
	assert.Equal(t, "no order 42 in the ERP", got.Note)
}

// A worker whose journal has no liveness (WithoutLiveness: a PgBouncer in
// transaction mode) leaves no record of being alive: its operation is not
// taken from it before its lease lapses, dead or alive, and the fleet
// views do not call it gone while its lease holds.
func TestPostgresReconcileOfAWorkerWithoutLiveness(t *testing.T) {
	t.Parallel()
	schema, j := pgJournal(t)
	_, rec, app, exited := storyHolding(t, func() idem.Journal { return j },
		"IDEM_TEST_SCHEMA="+schema, "IDEM_TEST_NO_LIVENESS=1")
	until := "being driven by " + rec.Lease.Owner + " until " + rec.Lease.ExpiresAt.UTC().Format(time.RFC3339)
	reconcile := func() result {
		return idemOnPG(t, schema, "reconcile", rec.Key, "--as", "rejected", "--note", "no order 42 in the ERP")
	}

	before := pgSnapshot(t, schema)
	requireOneLineError(t, reconcile(), exitError, until)
	assert.Equal(t, before, pgSnapshot(t, schema), "a refused reconcile wrote")
	r := idemOnPG(t, schema, "stats")
	requireOK(t, r)
	assert.Regexp(t, `(?m)^  `+regexp.QuoteMeta(rec.Lease.Owner)+` +holding +1 +`, r.stdout)

	require.NoError(t, app.Process.Kill())
	<-exited
	requireOneLineError(t, reconcile(), exitError, until)
	assert.Equal(t, before, pgSnapshot(t, schema), "a refused reconcile wrote")
}

// A worker that is alive but stopped (SIGSTOP) past the end of its lease
// no longer holds the operation: the reconcile goes through, as another
// worker's claim would, and when the worker runs again and learns the
// outcome its write is fenced off (its lease is gone): the operator's
// decision stays.
func TestReconcileAfterAStoppedWorkersLeaseLapsed(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"sqlite", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var (
				srv    *storyServer
				rec    idem.Record
				app    *exec.Cmd
				exited <-chan struct{}
				get    func() idem.Record
				settle func() result
				snap   func() snapshot
			)
			args := []string{"reconcile", "", "--as", "rejected", "--note", "no order 42 in the ERP"}
			if kind == "sqlite" {
				var path string
				srv, path, rec, app, exited = holdingTheLeaseFor(t, "2s")
				get = func() idem.Record { return getRecord(t, path, rec.Key) }
				settle = func() result { args[1] = rec.Key; return idemOn(t, path, args...) }
				snap = func() snapshot { return takeSnapshot(t, path) }
			} else {
				schema, j := pgJournal(t)
				srv, rec, app, exited = storyHolding(t, func() idem.Journal { return j },
					"IDEM_TEST_SCHEMA="+schema, "IDEM_TEST_LEASE=2s")
				get = func() idem.Record {
					got, err := j.Get(context.Background(), rec.Key)
					require.NoError(t, err)
					return got
				}
				settle = func() result { args[1] = rec.Key; return idemOnPG(t, schema, args...) }
				snap = func() snapshot { return pgSnapshot(t, schema) }
			}
			require.NoError(t, app.Process.Signal(syscall.SIGSTOP))
			// Its lease lapses: the journal's clock passes its end.
			for {
				before := snap()
				r := settle()
				if r.code == exitOK {
					break
				}
				requireOneLineError(t, r, exitError, "being driven by "+rec.Lease.Owner)
				assert.Equal(t, before, snap(), "a refused reconcile wrote")
				time.Sleep(100 * time.Millisecond)
			}
			require.NoError(t, app.Process.Signal(syscall.SIGCONT))
			srv.letGo()
			<-exited
			got := get()
			assert.Equal(t, idem.StateRejected, got.State, "the worker overwrote the operator's decision")
			assert.Equal(t, "no order 42 in the ERP", got.Note)
		})
	}
}

// On PostgreSQL, reconciles racing the live worker as it settles the
// operation: each is refused, as leased, then as settled, and the
// worker's outcome stays.
func TestPostgresReconcileAsTheWorkerSettles(t *testing.T) {
	t.Parallel()
	schema, j := pgJournal(t)
	srv, rec, _, exited := storyHolding(t, func() idem.Journal { return j }, "IDEM_TEST_SCHEMA="+schema)
	srv.letGo()
	for {
		r := idemOnPG(t, schema, "reconcile", rec.Key, "--as", "rejected", "--note", "no order 42 in the ERP")
		require.Equal(t, exitError, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
		if strings.Contains(r.stderr, "being driven by "+rec.Lease.Owner) {
			continue
		}
		requireOneLineError(t, r, exitError, "is succeeded; only unknown or expired operations are reconciled")
		break
	}
	<-exited
	got, err := j.Get(context.Background(), rec.Key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, got.State)
	assert.Empty(t, got.Note, "the worker's outcome was overwritten")
}
