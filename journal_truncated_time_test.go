package idem_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A time a caller writes that truncates to the zero instant (1 ns after
// 0001-01-01 UTC: journal times are whole milliseconds) comes back from a
// MemoryJournal as a Local time at the zero instant, which IsZero but is not
// time.Time{}, where the SQLite journal's Get gives back time.Time{}; and the
// SQLite journal's Update returns the Local one, its Get the other. The
// MemoryJournal keeps such a settled record as a live form (packRecord
// refuses a time that would not read back as it is), so it stays a record
// the collector scans. Correct: every journal, in what Update returns and
// what Get returns, gives such a time back as time.Time{}, as it gives back
// every zero time, and the same record from both journals is the same.
func TestAJournalGivesBackATimeThatTruncatesToZeroAsTheZeroTime(t *testing.T) {
	t.Parallel()
	almostZero := time.Date(1, time.January, 1, 0, 0, 0, 1, time.UTC)
	read := map[string]idem.Record{}
	for name, j := range map[string]idem.Journal{
		"memory": idem.NewMemoryJournal(),
		"sqlite": openJournal(t, filepath.Join(t.TempDir(), "ops.db")),
	} {
		ctx := t.Context()
		rec, _, err := j.Create(ctx, idem.Record{
			Key: "k", Scope: "s", ID: "a", Method: "POST", URL: "https://api.example.test/orders",
			Fingerprint: "f", KeyHeader: "Idempotency-Key", State: idem.StatePending,
		})
		require.NoError(t, err, name)
		rec.State = idem.StateSucceeded
		rec.Response = &idem.Response{StatusCode: 201}
		rec.ExpiresAt, rec.NextAttemptAt = almostZero, almostZero
		updated, err := j.Update(ctx, rec, idem.Durable, idem.Event{})
		require.NoError(t, err, name)
		got, err := j.Get(ctx, rec.Key)
		require.NoError(t, err, name)
		for what, at := range map[string]time.Time{
			"Update's ExpiresAt": updated.ExpiresAt, "Update's NextAttemptAt": updated.NextAttemptAt,
			"Get's ExpiresAt": got.ExpiresAt, "Get's NextAttemptAt": got.NextAttemptAt,
		} {
			assert.True(t, at == time.Time{}, "%s: %s is %#v, not time.Time{}", name, what, at)
		}
		got.CreatedAt, got.UpdatedAt = time.Time{}, time.Time{}
		read[name] = got
	}
	assert.Equal(t, read["sqlite"], read["memory"], "the same record from both journals")
}
