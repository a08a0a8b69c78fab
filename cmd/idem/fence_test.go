package main

import (
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
