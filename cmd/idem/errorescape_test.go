package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// An error message that quotes what the journal holds — here an
// operation's ID, in the refusal to cancel or reconcile an operation a
// live worker drives — must not pass the ID's control characters to the
// terminal, as ls and show do not: an ESC there lets whoever chose the ID
// drive the operator's terminal.
func TestErrorMessagesCarryNoControlCharacters(t *testing.T) {
	t.Parallel()
	path, j := openTestJournal(t)
	ctx := context.Background()
	rec := put(t, j, op{id: "pay/\x1b]0;owned\x07invoice-7\x1b[2J", path: []idem.State{idem.StateInFlight, idem.StateUnknown}})
	// A pending one to cancel: the state machine refuses to cancel an
	// unknown one before the lease is looked at.
	pending := put(t, j, op{id: "pay/\x1b]0;owned\x07invoice-8\x1b[2J"})
	unregister, err := j.Register(ctx, "worker-\x1b[31ma")
	require.NoError(t, err)
	t.Cleanup(func() { _ = unregister() })
	for _, key := range []string{rec.Key, pending.Key} {
		_, err = j.Acquire(ctx, key, "worker-\x1b[31ma", time.Hour)
		require.NoError(t, err)
	}
	for _, args := range [][]string{
		{"cancel", pending.Key},
		{"reconcile", rec.Key, "--as", "succeeded", "--note", "matched"},
	} {
		r := idemOn(t, path, args...)
		requireOneLineError(t, r, exitError, "being driven by")
		require.NotContains(t, r.stderr, "\x1b", "idem %v passed an ESC to the terminal", args)
		require.NotContains(t, r.stderr, "\x07", "idem %v passed a BEL to the terminal", args)
	}
	require.NoError(t, j.Close())
}
