package idem_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// historyCase writes one operation's life to j and returns its key.
type historyCase func(ctx context.Context, j idem.Journal, id string) (string, error)

// historyCases are the shapes of history that schema 5 derives (a Do
// answered at its first attempt: a success, a rejection, one with a note)
// and some it must write (a second attempt, an answer with a detail, a
// release before the answer), with the first version's derived creation
// event (pending).
var historyCases = map[string]historyCase{
	"answered": func(ctx context.Context, j idem.Journal, id string) (string, error) {
		return settleFirst(ctx, j, id, idem.StateSucceeded, 201, "", "")
	},
	"rejected": func(ctx context.Context, j idem.Journal, id string) (string, error) {
		return settleFirst(ctx, j, id, idem.StateRejected, 422, "", "")
	},
	"noted": func(ctx context.Context, j idem.Journal, id string) (string, error) {
		return settleFirst(ctx, j, id, idem.StateSucceeded, 201, "response body cut at 10 bytes", "")
	},
	"detail": func(ctx context.Context, j idem.Journal, id string) (string, error) {
		return settleFirst(ctx, j, id, idem.StateSucceeded, 200, "", "replayed by the server")
	},
	"retried": func(ctx context.Context, j idem.Journal, id string) (string, error) {
		rec, err := createInFlight(ctx, j, id)
		if err != nil {
			return "", err
		}
		rec.Attempts = 2
		rec.LastError = "503 Service Unavailable"
		if rec, err = j.Update(ctx, rec, idem.Durable, idem.Event{Kind: idem.EventSend, Detail: "503"}); err != nil {
			return "", err
		}
		rec.State, rec.LastError = idem.StateSucceeded, ""
		rec.Response = &idem.Response{StatusCode: 201, Body: []byte(`{"ok":true}`)}
		_, err = j.Update(ctx, rec, idem.Deferred, idem.Event{Kind: idem.EventAnswer})
		return rec.Key, err
	},
	"released": func(ctx context.Context, j idem.Journal, id string) (string, error) {
		rec, err := createInFlight(ctx, j, id)
		if err != nil {
			return "", err
		}
		time.Sleep(2 * time.Millisecond) // the release's time differs from the creation's
		if err := j.Release(ctx, rec.Key, rec.Lease); err != nil {
			return "", err
		}
		rec.Lease = idem.Lease{}
		rec.State, rec.Response = idem.StateSucceeded, &idem.Response{StatusCode: 201}
		_, err = j.Update(ctx, rec, idem.Deferred, idem.Event{Kind: idem.EventAnswer})
		return rec.Key, err
	},
	"pending": func(ctx context.Context, j idem.Journal, id string) (string, error) {
		rec, _, err := j.Create(ctx, testRecord("default", id, []byte(`{"n":1}`)))
		return rec.Key, err
	},
}

func createInFlight(ctx context.Context, j idem.Journal, id string) (idem.Record, error) {
	rec := testRecord("default", id, []byte(`{"n":1}`))
	rec.State, rec.Attempts = idem.StateInFlight, 1
	rec.Lease = idem.Lease{Owner: "worker-1", ExpiresAt: time.Now().Add(time.Minute)}
	rec, _, err := j.Create(ctx, rec)
	return rec, err
}

// settleFirst is a Do answered at its first attempt: created in_flight,
// then settled by the same owner.
func settleFirst(ctx context.Context, j idem.Journal, id string, state idem.State, status int, lastError, detail string) (string, error) {
	rec, err := createInFlight(ctx, j, id)
	if err != nil {
		return "", err
	}
	time.Sleep(2 * time.Millisecond) // the answer's time differs from the creation's
	rec.State, rec.LastError = state, lastError
	rec.Response = &idem.Response{StatusCode: status, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":"o-1"}`)}
	_, err = j.Update(ctx, rec, idem.Deferred, idem.Event{Kind: idem.EventAnswer, Detail: detail})
	return rec.Key, err
}

// writeHistories runs every case on j, each with the ID of its name plus
// suffix, and returns the histories by case name.
func writeHistories(t *testing.T, j idem.Journal, suffix string) map[string][]idem.Event {
	t.Helper()
	ctx := context.Background()
	out := map[string][]idem.Event{}
	for name, c := range historyCases {
		key, err := c(ctx, j, name+suffix)
		require.NoError(t, err, name)
		out[name], err = j.History(ctx, key)
		require.NoError(t, err, name)
	}
	return out
}

// fixtureEvent is an Event as the fixture's JSON keeps it (a creation
// event's From, zero, is no State to marshal).
type fixtureEvent struct {
	Version, AtMillis    int64
	Kind                 idem.EventKind
	Detail, Error, Owner string
	From, To             uint8
	Attempt, StatusCode  int
}

func toFixture(evs []idem.Event) []fixtureEvent {
	out := make([]fixtureEvent, len(evs))
	for i, ev := range evs {
		out[i] = fixtureEvent{Version: ev.Version, AtMillis: ev.At.UnixMilli(), Kind: ev.Kind, Detail: ev.Detail,
			Error: ev.Error, Owner: ev.Owner, From: uint8(ev.From), To: uint8(ev.To), Attempt: ev.Attempt, StatusCode: ev.StatusCode}
	}
	return out
}

func fromFixture(evs []fixtureEvent) []idem.Event {
	out := make([]idem.Event, len(evs))
	for i, ev := range evs {
		out[i] = idem.Event{Version: ev.Version, At: time.UnixMilli(ev.AtMillis), Kind: ev.Kind, Detail: ev.Detail,
			Error: ev.Error, Owner: ev.Owner, From: idem.State(ev.From), To: idem.State(ev.To), Attempt: ev.Attempt, StatusCode: ev.StatusCode}
	}
	return out
}

// shape is an event without its time, which differs from one run to the
// next; at checks the times apart.
func shape(evs []idem.Event) []idem.Event {
	out := make([]idem.Event, len(evs))
	for i, ev := range evs {
		ev.At = time.Time{}
		out[i] = ev
	}
	return out
}

// A Do's history that schema 5 derives from the settled row reads exactly
// as a MemoryJournal's, which writes every event, and as the events schema
// 4 wrote; the histories it cannot derive are written and read the same
// too. The derived ones leave no row in events.
func TestSQLiteDerivedHistoryReadsAsWritten(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	j := openJournal(t, path)
	got := writeHistories(t, j, "")
	want := writeHistories(t, idem.NewMemoryJournal(), "")
	for name := range historyCases {
		assert.Equal(t, shape(want[name]), shape(got[name]), name)
	}
	ctx := context.Background()
	for name, evs := range got {
		rec, err := j.Lookup(ctx, "default", name)
		require.NoError(t, err)
		assert.Equal(t, rec.CreatedAt.UnixMilli(), evs[0].At.UnixMilli(), "%s: created at", name)
		assert.Equal(t, rec.UpdatedAt.UnixMilli(), evs[len(evs)-1].At.UnixMilli(), "%s: last event at", name)
		assert.Empty(t, rec.Lease.Owner, "%s: a settled record has no lease owner, whoever the row keeps", name)
	}
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	written := map[string]int{}
	rows, err := db.Query(`SELECT o.op_id, count(e.op) FROM operations o LEFT JOIN events e ON e.op = o.id GROUP BY o.op_id`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		written[id] = n
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, map[string]int{"answered": 0, "rejected": 0, "noted": 0, "pending": 0,
		"detail": 2, "retried": 3, "released": 2}, written, "events written per operation")
}

// testdata/journal-v4.db was written by the code of schema 4 (the creation
// event derived, every later event written) by TestWriteJournalV4Fixture
// below, with the histories it read then in testdata/journal-v4.json.
// Migrated, it reads the same, and the same cases written now read as they
// did then.
func TestSQLiteMigratesASchema4Journal(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	b, err := os.ReadFile("testdata/journal-v4.db")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o600))
	require.Equal(t, 4, userVersion(t, path), "the fixture is a schema-4 journal")
	var fixture map[string][]fixtureEvent
	b, err = os.ReadFile("testdata/journal-v4.json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &fixture))
	require.Len(t, fixture, len(historyCases))
	then := map[string][]idem.Event{}
	for name, evs := range fixture {
		then[name] = fromFixture(evs)
	}

	ctx := context.Background()
	j := openJournal(t, path)
	for name, want := range then {
		rec, err := j.Lookup(ctx, "default", name)
		require.NoError(t, err, name)
		got, err := j.History(ctx, rec.Key)
		require.NoError(t, err, name)
		require.Len(t, got, len(want), name)
		for i := range want {
			assert.True(t, want[i].At.Equal(got[i].At), "%s: event %d at %v, was %v", name, i, got[i].At, want[i].At)
		}
		assert.Equal(t, shape(want), shape(got), name)
	}
	now := writeHistories(t, j, "-new")
	for name := range historyCases {
		assert.Equal(t, shape(then[name]), shape(now[name]), name)
	}
	require.NoError(t, j.Close())
	assert.Equal(t, 6, userVersion(t, path), "the journal was migrated to the current schema (6)")
}

// TestWriteJournalV4Fixture wrote testdata/journal-v4.db and its histories
// with the code of schema 4 (it runs only when IDEM_WRITE_V4_FIXTURE names
// the directory to write them to).
func TestWriteJournalV4Fixture(t *testing.T) {
	dir := os.Getenv("IDEM_WRITE_V4_FIXTURE")
	if dir == "" {
		t.Skip("writes the schema-4 fixture; set IDEM_WRITE_V4_FIXTURE")
	}
	path := filepath.Join(dir, "journal-v4.db")
	j, err := idem.OpenSQLite(path)
	require.NoError(t, err)
	hs := map[string][]fixtureEvent{}
	for name, evs := range writeHistories(t, j, "") {
		hs[name] = toFixture(evs)
	}
	require.NoError(t, j.Close())
	require.Equal(t, 4, userVersion(t, path))
	b, err := json.MarshalIndent(hs, "", "\t")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "journal-v4.json"), b, 0o644))
	fmt.Println("wrote", path)
}

// A terminal record's due time reads back as written, whether zero or
// not, and a settled record is never claimed.
func TestSQLiteSettledDueTimeReadsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
	for name, due := range map[string]time.Time{
		"zero": {}, "set": time.UnixMilli(1_796_000_000_123), "before-1970": time.UnixMilli(-5000),
	} {
		rec, err := createInFlight(ctx, j, name)
		require.NoError(t, err)
		rec.State, rec.NextAttemptAt = idem.StateSucceeded, due
		rec.Response = &idem.Response{StatusCode: 201}
		_, err = j.Update(ctx, rec, idem.Deferred, idem.Event{Kind: idem.EventAnswer})
		require.NoError(t, err)
		got, err := j.Get(ctx, rec.Key)
		require.NoError(t, err)
		assert.True(t, due.Equal(got.NextAttemptAt), "%s: due %v, read %v", name, due, got.NextAttemptAt)
	}
	pending, _, err := j.Create(ctx, testRecord("default", "pending", []byte("x")))
	require.NoError(t, err)
	claimed, err := j.Claim(ctx, idem.ClaimRequest{Owner: "worker-2", Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1, "only the pending record is due")
	assert.Equal(t, pending.Key, claimed[0].Key)
}
