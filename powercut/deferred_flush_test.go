package powercut

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func init() { children["deferred-settle"] = childDeferredSettle }

// deferredFlushInterval is the journal's flush interval in the child of
// TestPowerCutDeferredSettleIsFlushedWithinTheInterval.
const deferredFlushInterval = 100 * time.Millisecond

// childDeferredSettle records one operation in flight (a durable commit),
// settles it with a Deferred update, says so, and then writes nothing more
// until it is killed: no durable commit comes along to carry the settle's
// fsync, only the flusher can. With PC_THEN_DURABLE set, the flush
// interval is an hour and a durable create follows the settle: its fsync
// alone must carry the settle.
func childDeferredSettle() error {
	interval := deferredFlushInterval
	thenDurable := os.Getenv("PC_THEN_DURABLE") != ""
	if thenDurable {
		interval = time.Hour // only the durable commit can sync the settle
	}
	j, err := idem.OpenSQLite(os.Getenv("PC_JOURNAL"), idem.SQLiteFlushInterval(interval))
	if err != nil {
		return err
	}
	defer j.Close()
	ctx := context.Background()
	body := []byte(`{"item":"book"}`)
	sum := sha256.Sum256(body)
	rec, _, err := j.Create(ctx, idem.Record{
		Key: "pc-deferred", Scope: "pc", ID: "op-deferred", Method: http.MethodPost,
		URL: "http://127.0.0.1:9/orders", Body: body, Fingerprint: hex.EncodeToString(sum[:]),
		KeyHeader: "Idempotency-Key", State: idem.StateInFlight, Attempts: 1,
		Lease: idem.Lease{Owner: "pc", ExpiresAt: time.Now().Add(time.Hour)},
	})
	if err != nil {
		return err
	}
	rec.State = idem.StateSucceeded
	rec.Response = &idem.Response{StatusCode: 201}
	if _, err := j.Update(ctx, rec, idem.Deferred, idem.Event{Kind: idem.EventAnswer}); err != nil {
		return err
	}
	if thenDurable {
		next := idem.Record{
			Key: "pc-durable", Scope: "pc", ID: "op-durable", Method: http.MethodPost,
			URL: "http://127.0.0.1:9/orders", Body: body, Fingerprint: hex.EncodeToString(sum[:]),
			KeyHeader: "Idempotency-Key", State: idem.StatePending,
		}
		if _, _, err := j.Create(ctx, next); err != nil {
			return err
		}
	}
	fmt.Println("settled")
	select {} // killed
}

// A Deferred update "becomes durable with the next durable write or within
// the journal's flush interval" (journal.go, journal_sqlite.go's
// Durability). Since the committer stopped waking the flusher after each
// deferred commit (schema 6's merge), only the flusher's own bookkeeping
// syncs a settle that no durable commit follows. Here a process settles an
// operation deferred, writes nothing more, is SIGKILLed ten flush
// intervals later, and the power is cut: the operation must read succeeded,
// not in_flight.
func TestPowerCutDeferredSettleIsFlushedWithinTheInterval(t *testing.T) {
	f := mountCutFS(t)
	child := startChild(t, "", "deferred-settle", "PC_JOURNAL="+filepath.Join(f.Dir(), "journal.db"))
	_, ok := child.waitFor("settled")
	if !ok {
		lines, err := child.wait()
		t.Fatalf("the child ended before settling (%v): %s", err, strings.Join(lines, "\n"))
	}
	// Ten times the bound the documentation gives: the flusher's tick is
	// no longer than the interval, so any working flusher has synced.
	time.Sleep(10 * deferredFlushInterval)
	child.kill()
	_, err := f.Cut(nil)
	require.NoError(t, err)

	recs := snapshotJournal(t, filepath.Join(f.Backing(), "journal.db"))
	require.Contains(t, recs, "op-deferred", "the durable create survived the cut")
	assert.Equal(t, idem.StateSucceeded, recs["op-deferred"].state,
		"the deferred settle was fsynced within the flush interval, before the kill and the cut")
}

// A durable commit's fsync covers the deferred commits before it (the
// committer clears the flusher's due time on it): a settle made Deferred,
// then a durable Create, then SIGKILL at once and a power cut, with a
// flush interval of an hour, must leave both on disk.
func TestPowerCutDeferredSettleIsCarriedByTheNextDurableCommit(t *testing.T) {
	f := mountCutFS(t)
	child := startChild(t, "", "deferred-settle", "PC_JOURNAL="+filepath.Join(f.Dir(), "journal.db"), "PC_THEN_DURABLE=1")
	if _, ok := child.waitFor("settled"); !ok {
		lines, err := child.wait()
		t.Fatalf("the child ended before settling (%v): %s", err, strings.Join(lines, "\n"))
	}
	child.kill()
	_, err := f.Cut(nil)
	require.NoError(t, err)

	recs := snapshotJournal(t, filepath.Join(f.Backing(), "journal.db"))
	require.Contains(t, recs, "op-durable", "the durable create survived the cut")
	assert.Equal(t, idem.StateSucceeded, recs["op-deferred"].state,
		"the deferred settle before it was fsynced with it")
}

// A new journal is made in rollback-journal mode, its tables created, and
// only then switched to WAL (schema 6's order): two rollback journals are
// made and deleted beside it before its first intent. A power cut right
// after its first durable commits, torn or not, must leave a journal that
// opens with them: a deleted rollback journal that came back hot would
// roll the file back to nothing (and SQLite then deletes the WAL of an
// empty file). Twenty new journals, each cut at once.
func TestPowerCutNewJournalKeepsItsFirstCommits(t *testing.T) {
	f := mountCutFS(t)
	rnd, _ := loopRand(t)
	for i := range 20 {
		name := fmt.Sprintf("journal-%d.db", i)
		child := startChild(t, "", "deferred-settle", "PC_JOURNAL="+filepath.Join(f.Dir(), name), "PC_THEN_DURABLE=1")
		if _, ok := child.waitFor("settled"); !ok {
			lines, err := child.wait()
			t.Fatalf("the child ended before settling (%v): %s", err, strings.Join(lines, "\n"))
		}
		child.kill()
		var tear *rand.Rand
		if rnd.IntN(2) == 0 {
			tear = rnd
		}
		_, err := f.Cut(tear)
		require.NoError(t, err)
		recs := snapshotJournal(t, filepath.Join(f.Backing(), name))
		require.Contains(t, recs, "op-durable", "cut %d: the durable create survived", i)
		require.Equal(t, idem.StateSucceeded, recs["op-deferred"].state, "cut %d", i)
	}
}
