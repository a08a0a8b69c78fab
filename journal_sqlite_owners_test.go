package idem_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func init() { children["journal-owner"] = childOwner }

// childOwner registers as owner IDEM_OWNER in the journal IDEM_JOURNAL,
// creates an in_flight record leased for an hour, prints its key, and
// waits to be killed.
func childOwner() error {
	ctx := context.Background()
	j, err := idem.OpenSQLite(os.Getenv("IDEM_JOURNAL"))
	if err != nil {
		return err
	}
	owner := os.Getenv("IDEM_OWNER")
	if _, err := j.Register(ctx, owner); err != nil {
		return err
	}
	rec := testRecord("s", "leased-by-"+owner, []byte("body"))
	rec.State = idem.StateInFlight
	rec.Attempts = 1
	rec.Lease = idem.Lease{Owner: owner, ExpiresAt: time.Now().Add(time.Hour)}
	if _, _, err := j.Create(ctx, rec); err != nil {
		return err
	}
	fmt.Println(rec.Key)
	select {}
}

// A process that dies (SIGKILL) holding an hour-long lease loses it at once:
// every process on the machine sees that its owner is gone.
func TestSQLiteLeaseOfAKilledProcessIsTakenAtOnce(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	j := openJournal(t, path)
	cmd := childCommand(t, "journal-owner", "IDEM_JOURNAL="+path, "IDEM_OWNER=pod-1#dead")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	key, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	key = key[:len(key)-1]

	ctx := context.Background()
	got, err := j.Claim(ctx, idem.ClaimRequest{Owner: "pod-1#new", Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	assert.Empty(t, got, "the owner is alive: its lease is not taken")
	_, err = j.Acquire(ctx, key, "pod-1#new", time.Minute)
	require.ErrorIs(t, err, idem.ErrLeased)

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	got, err = j.Claim(ctx, idem.ClaimRequest{Owner: "pod-1#new", Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, got, 1, "the owner was killed: its lease is taken at once, not in an hour")
	assert.Equal(t, key, got[0].Key)
	assert.Equal(t, int64(2), got[0].Lease.Epoch)
	evs, err := j.History(ctx, key)
	require.NoError(t, err)
	last := evs[len(evs)-1]
	assert.Equal(t, idem.EventClaim, last.Kind)
	assert.Equal(t, "taken over from pod-1#dead: its owner is gone", last.Detail)

	// Its lock file stays while a record refers to it, and is forgotten
	// by the next open once none does.
	entries, err := os.ReadDir(path + "-owners")
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.NoError(t, j.Close())
	openJournal(t, path)
	entries, err = os.ReadDir(path + "-owners")
	require.NoError(t, err)
	assert.Empty(t, entries, "no record refers to the dead owner any more")
}

// The owners' directory is private, and a clean Close leaves no lock file
// behind when the owner holds no lease.
func TestSQLiteOwnersDirectoryIsPrivateAndTidy(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	j := openJournal(t, path)
	unregister, err := j.Register(context.Background(), "worker#1")
	require.NoError(t, err)
	fi, err := os.Stat(path + "-owners")
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	entries, err := os.ReadDir(path + "-owners")
	require.NoError(t, err)
	require.Len(t, entries, 1)
	info, err := entries[0].Info()
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	require.NoError(t, unregister())
	entries, err = os.ReadDir(path + "-owners")
	require.NoError(t, err)
	assert.Empty(t, entries, "an owner without leases leaves nothing behind")
}

// Sync commits buffered writes: another handle on the file (another
// process) sees them after it.
func TestSQLiteSyncCommitsBufferedWrites(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	ctx := context.Background()
	j := openJournal(t, path, idem.SQLiteLingerDelay(time.Hour))
	other := openJournal(t, path)
	rec, _, err := j.Create(ctx, testRecord("s", "op", []byte("b")))
	require.NoError(t, err)
	next := rec
	next.State = idem.StateInFlight
	next.Attempts = 1
	_, err = j.Update(ctx, next, idem.Buffered, idem.Event{Kind: idem.EventSend})
	require.NoError(t, err)
	seen, err := other.Get(ctx, rec.Key)
	require.NoError(t, err)
	require.Equal(t, idem.StatePending, seen.State, "the buffered write lingers uncommitted")
	require.NoError(t, j.Sync(ctx))
	seen, err = other.Get(ctx, rec.Key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateInFlight, seen.State, "Sync committed it")
}
