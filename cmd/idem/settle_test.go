package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func TestReconcile(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)

	unknown := recs[rUnknown]
	r := idemOn(t, path, "reconcile", unknown.Key, "--as", "succeeded", "--note", "matched order 9812 in the ERP")
	requireOK(t, r)
	assert.Equal(t, "reconciled "+unknown.Key+" (default/"+longID+") as succeeded, was unknown\n", r.stdout)
	rec := getRecord(t, path, unknown.Key)
	assert.Equal(t, idem.StateSucceeded, rec.State)
	assert.Equal(t, "matched order 9812 in the ERP", rec.Note)
	assert.Equal(t, unknown.Version+1, rec.Version)

	// Named by scope and ID, flags before the argument.
	r = idemOn(t, path, "reconcile", "--as", "rejected", "--note", "no shipment found", "tenant-b/ship/s-9")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "as rejected, was expired")
	rec = getRecord(t, path, recs[rExpired].Key)
	assert.Equal(t, idem.StateRejected, rec.State)
	assert.Equal(t, "no shipment found", rec.Note)

	// The decision is in the history, with its note.
	r = idemOn(t, path, "show", recs[rExpired].Key)
	requireOK(t, r)
	assert.Regexp(t, `(?m)^  4 +\S+ \S+ +operator +expired → rejected +1 +- +- +reconciled as rejected; no shipment found$`, r.stdout)

	// Everything else is untouched.
	snap := takeSnapshot(t, path)
	for _, rec := range snap.Records {
		if rec.Key != unknown.Key && rec.Key != recs[rExpired].Key {
			for _, orig := range recs {
				if orig.Key == rec.Key {
					assert.Equal(t, orig, rec)
				}
			}
		}
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)
	r := idemOn(t, path, "cancel", "default/checkout/cart-42")
	requireOK(t, r)
	assert.Equal(t, "canceled "+recs[rPending].Key+" (default/checkout/cart-42)\n", r.stdout)
	assert.Equal(t, idem.StateCanceled, getRecord(t, path, recs[rPending].Key).State)

	// Canceling it again is an illegal transition.
	before := takeSnapshot(t, path)
	r = idemOn(t, path, "cancel", recs[rPending].Key)
	requireOneLineError(t, r, 1, "illegal state transition")
	assert.Equal(t, before, takeSnapshot(t, path))
}

func TestSettleRefusesLeasedOperation(t *testing.T) {
	t.Parallel()
	path, j := openTestJournal(t)
	pending := put(t, j, op{id: "leased/pending"})
	unknown := put(t, j, op{id: "leased/unknown", path: []idem.State{idem.StateInFlight, idem.StateUnknown}})
	ctx := context.Background()
	// A live worker holds both operations.
	_, err := j.Acquire(ctx, pending.Key, "worker-1", time.Hour)
	require.NoError(t, err)
	_, err = j.Acquire(ctx, unknown.Key, "worker-1", time.Hour)
	require.NoError(t, err)
	require.NoError(t, j.Close())
	before := takeSnapshot(t, path)

	r := idemOn(t, path, "cancel", pending.Key)
	requireOneLineError(t, r, 1, `being driven by worker-1`)
	r = idemOn(t, path, "reconcile", unknown.Key, "--as", "succeeded", "--note", "looked in the ERP")
	requireOneLineError(t, r, 1, `being driven by worker-1`)
	assert.Equal(t, before, takeSnapshot(t, path))
}

// The CLI works on a journal that another process holds open and keeps
// writing: readers do not block it, and writes wait for its lock.
func TestWhileAnotherProcessWrites(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)
	j, err := idem.OpenSQLite(path)
	require.NoError(t, err)
	defer j.Close()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	written := 0
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			rec := idem.Record{Key: newKey(), Scope: "writer", ID: newKey(), Method: "POST", URL: "https://api.example.com/x",
				Fingerprint: "f", KeyHeader: "Idempotency-Key", State: idem.StatePending}
			if _, _, err := j.Create(context.Background(), rec); err != nil {
				t.Error(err)
				return
			}
			written++
			time.Sleep(time.Millisecond) // leave the lock to others now and then, as an application does
		}
	}()

	r := idemOn(t, path, "ls", "--json", "--scope", "default")
	requireOK(t, r)
	assert.Len(t, jsonLines(t, r.stdout), 5)
	requireOK(t, idemOn(t, path, "stats"))
	r = idemOn(t, path, "reconcile", recs[rUnknown].Key, "--as", "succeeded", "--note", "checked")
	requireOK(t, r)
	close(stop)
	wg.Wait()

	// The writer's handle sees the CLI's change, and the CLI the writer's.
	rec, err := j.Get(context.Background(), recs[rUnknown].Key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
	r = idemOn(t, path, "ls", "--json", "--scope", "writer")
	requireOK(t, r)
	assert.Len(t, jsonLines(t, r.stdout), written)
}
