package main

import (
	"context"
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
