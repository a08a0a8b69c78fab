package powercut

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func init() {
	children["sqlite-reader"] = childSQLiteReader
	children["close-beside-reader"] = childCloseBesideReader
}

// childSQLiteReader opens the file at PC_JOURNAL as any SQLite program
// would (an operator's sqlite3 shell, a backup tool), begins a read
// transaction, says so, and holds it until killed.
func childSQLiteReader() error {
	db, err := sql.Open("sqlite3", "file:"+os.Getenv("PC_JOURNAL"))
	if err != nil {
		return err
	}
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	var n int
	if err := tx.QueryRow("SELECT count(*) FROM operations").Scan(&n); err != nil {
		return err
	}
	fmt.Println("reading", n)
	select {} // killed
}

// childCloseBesideReader works on the journal at PC_JOURNAL, in a process
// of its own: the journal maps its -shm, and a process that maps a file of
// the mount it serves itself can hang for good (a fault on the mapping
// waits for the file system, whose goroutines wait for the fault's thread
// at the garbage collector's stop of the world). With PC_PHASE=create it
// records an operation in flight, durably, and closes the journal; with
// PC_PHASE=settle it settles the operation with a Deferred update and
// closes the journal, and Close's error is the child's.
func childCloseBesideReader() error {
	ctx := context.Background()
	j, err := idem.OpenSQLite(os.Getenv("PC_JOURNAL"))
	if err != nil {
		return err
	}
	if os.Getenv("PC_PHASE") == "create" {
		body := []byte(`{"item":"book"}`)
		sum := sha256.Sum256(body)
		if _, _, err := j.Create(ctx, idem.Record{
			Key: "pc-close", Scope: "pc", ID: "op-close", Method: http.MethodPost,
			URL: "http://127.0.0.1:9/orders", Body: body, Fingerprint: hex.EncodeToString(sum[:]),
			KeyHeader: "Idempotency-Key", State: idem.StateInFlight, Attempts: 1,
			Lease: idem.Lease{Owner: "pc", ExpiresAt: time.Now().Add(time.Hour)},
		}); err != nil {
			_ = j.Close()
			return err
		}
		return j.Close()
	}
	rec, err := j.Get(ctx, "pc-close")
	if err != nil {
		_ = j.Close()
		return err
	}
	rec.State = idem.StateSucceeded
	rec.Response = &idem.Response{StatusCode: 201}
	if _, err := j.Update(ctx, rec, idem.Deferred, idem.Event{Kind: idem.EventAnswer}); err != nil {
		_ = j.Close()
		return err
	}
	return j.Close()
}

// SQLiteJournal.Close "makes every deferred write durable". It stops the
// flusher and relies on a PASSIVE checkpoint to sync what deferred
// commits left in the WAL; a checkpoint that cannot run (another
// process's read transaction holds the database as it was) syncs nothing,
// and the WAL outlives the journal's connections, unsynced. Here an
// operation is created (durably), another process begins a read, the
// operation is settled with a Deferred update and the journal closed at
// once (no error), then the reader is killed and the power cut: the
// settle must have survived, as Close promised. It reads in_flight.
func TestPowerCutDeferredSettleSurvivesCloseBesideAReader(t *testing.T) {
	f := mountCutFS(t)
	path := filepath.Join(f.Dir(), "journal.db")
	phase := func(name string) {
		t.Helper()
		lines, err := startChild(t, "", "close-beside-reader", "PC_JOURNAL="+path, "PC_PHASE="+name).wait()
		require.NoError(t, err, "the %s phase: %s", name, strings.Join(lines, "\n"))
	}
	phase("create")

	reader := startChild(t, "", "sqlite-reader", "PC_JOURNAL="+path)
	if _, ok := reader.waitFor("reading"); !ok {
		lines, err := reader.wait()
		t.Fatalf("the reader ended (%v): %s", err, strings.Join(lines, "\n"))
	}
	defer reader.kill()

	phase("settle") // Close made the deferred settle durable, or the child failed
	reader.kill()
	_, err := f.Cut(nil)
	require.NoError(t, err)
	recs := snapshotJournal(t, filepath.Join(f.Backing(), "journal.db"))
	require.Contains(t, recs, "op-close", "the durable create survived the cut")
	assert.Equal(t, idem.StateSucceeded, recs["op-close"].state,
		"the settle that Close returned after is on disk")
}
