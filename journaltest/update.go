package journaltest

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/journal"
)

func testUpdateCAS(t *testing.T, j idem.Journal) {
	rec := create(t, j, newRecord("tenant-a"))
	waitPast(t, rec.UpdatedAt)

	now := time.Now()
	next := journal.CloneRecord(rec)
	next.State = idem.StateInFlight
	next.Attempts = 1
	next.NextAttemptAt = now.Add(time.Minute)
	next.ExpiresAt = now.Add(24 * time.Hour)
	next.LastError = "dial tcp: connection refused"
	next.Note = "a note"
	before := time.Now()
	got, err := j.Update(t.Context(), next, idem.Durable, idem.Event{})
	after := time.Now()
	require.NoError(t, err)

	assert.Equal(t, rec.Version+1, got.Version, "Version")
	assertBetween(t, got.UpdatedAt, before, after, "UpdatedAt")
	assert.True(t, got.UpdatedAt.After(rec.UpdatedAt), "UpdatedAt moved on")
	assertTime(t, rec.CreatedAt, got.CreatedAt, "CreatedAt")
	assertRequest(t, rec, got)
	assert.Equal(t, idem.StateInFlight, got.State)
	assert.Equal(t, 1, got.Attempts)
	assertTime(t, next.NextAttemptAt, got.NextAttemptAt, "NextAttemptAt")
	assertTime(t, next.ExpiresAt, got.ExpiresAt, "ExpiresAt")
	assert.Equal(t, next.LastError, got.LastError)
	assert.Equal(t, next.Note, got.Note)
	requireStored(t, j, got)

	// Fields can be cleared as well as set.
	next = journal.CloneRecord(got)
	next.NextAttemptAt, next.ExpiresAt, next.LastError, next.Note = time.Time{}, time.Time{}, "", ""
	got = update(t, j, next, idem.Durable)
	assert.Equal(t, rec.Version+2, got.Version, "Version")
	assert.True(t, got.NextAttemptAt.IsZero(), "NextAttemptAt cleared")
	assert.True(t, got.ExpiresAt.IsZero(), "ExpiresAt cleared")
	assert.Empty(t, got.LastError)
	assert.Empty(t, got.Note)
	requireStored(t, j, got)
}

func testUpdateStaleVersion(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	rec := create(t, j, newRecord("tenant-a"))
	next := journal.CloneRecord(rec)
	next.State = idem.StateInFlight
	next.Attempts = 1
	v2 := update(t, j, next, idem.Durable)

	for _, version := range []int64{rec.Version, v2.Version + 1, 0} {
		stale := journal.CloneRecord(v2)
		stale.Version = version
		stale.State = idem.StateUnknown
		stale.Attempts = 2
		stale.LastError = "stale writer"
		_, err := j.Update(ctx, stale, idem.Durable, idem.Event{})
		require.ErrorIs(t, err, idem.ErrConflict, "update at version %d of a record at version %d", version, v2.Version)
		requireStored(t, j, v2)
	}
	assert.Len(t, history(t, j, rec.Key), 2, "no event for a refused update")
}

// legalMove is the state machine as documented: terminal states never
// change, canceled is reachable only from pending, expired may only be
// settled as succeeded or rejected (or stay expired), every other move
// between valid states is allowed.
func legalMove(from, to idem.State) bool {
	switch from {
	case idem.StateSucceeded, idem.StateRejected, idem.StateCanceled:
		return false
	case idem.StateExpired:
		return to == idem.StateSucceeded || to == idem.StateRejected || to == idem.StateExpired
	}
	if to == idem.StateCanceled {
		return from == idem.StatePending
	}
	return to.Valid()
}

func testUpdateTransitions(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	targets := append(idem.States(), 0, 99)
	for _, from := range idem.States() {
		for _, to := range targets {
			t.Run(fmt.Sprintf("%s_to_%s", from, to), func(t *testing.T) {
				rec := createIn(t, j, "tenant-a", from)
				next := journal.CloneRecord(rec)
				next.State = to
				got, err := j.Update(ctx, next, idem.Durable, idem.Event{})
				if legalMove(from, to) {
					require.NoError(t, err, "%s -> %s is allowed", from, to)
					assert.Equal(t, to, got.State)
					assert.Equal(t, rec.Version+1, got.Version)
					requireStored(t, j, got)
					return
				}
				require.ErrorIs(t, err, idem.ErrIllegalTransition, "%s -> %s is forbidden", from, to)
				requireStored(t, j, rec)
			})
		}
	}
}

func testUpdateImmutable(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	rec := newRecord("tenant-a")
	rec.Header = http.Header{"Content-Type": {"application/json"}, "Accept": {"a", "b"}}
	rec = create(t, j, rec)
	waitPast(t, rec.UpdatedAt)

	next := journal.CloneRecord(rec)
	next.Method = http.MethodDelete
	next.URL = "https://elsewhere.example.test/"
	next.Body = []byte("changed body")
	next.Header = http.Header{"X-Changed": {"1"}}
	next.Fingerprint = fingerprint(next.Body)
	next.Scope = "tenant-b"
	next.ID = "op-changed"
	next.CreatedAt = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	next.UpdatedAt = next.CreatedAt
	next.State = idem.StateInFlight
	next.Attempts = 1
	got, err := j.Update(ctx, next, idem.Durable, idem.Event{})
	require.NoError(t, err)

	assertRequest(t, rec, got)
	assertTime(t, rec.CreatedAt, got.CreatedAt, "CreatedAt")
	assert.True(t, got.UpdatedAt.After(rec.UpdatedAt), "UpdatedAt is set by the journal, not the caller")
	assert.Equal(t, idem.StateInFlight, got.State, "the mutable fields change")
	assert.Equal(t, 1, got.Attempts)
	requireStored(t, j, got)

	byOp, err := j.Lookup(ctx, rec.Scope, rec.ID)
	require.NoError(t, err)
	assert.Equal(t, rec.Key, byOp.Key)
	_, err = j.Lookup(ctx, next.Scope, next.ID)
	require.ErrorIs(t, err, idem.ErrNotFound, "the record did not move to another scope or ID")
}

func testUpdateResponse(t *testing.T, j idem.Journal) {
	cases := []struct {
		name  string
		state idem.State
		resp  idem.Response
	}{
		{"Full", idem.StateSucceeded, idem.Response{
			StatusCode: http.StatusCreated,
			Header: http.Header{
				"Content-Type": {"application/json"},
				"Link":         {"</a>; rel=next", "</b>; rel=prev"},
				"X-Empty":      {""},
			},
			Body:     []byte{'{', 0x00, 0xff, 0xfe, '}'},
			Replayed: true,
		}},
		// HTTP allows obs-text in a value (a Content-Disposition with a
		// Latin-1 file name), and net/http passes it on as is: a repeated
		// Do returns the first answer's bytes.
		{"HeaderNotUTF8", idem.StateSucceeded, idem.Response{
			StatusCode: http.StatusOK,
			Header: http.Header{
				"Content-Disposition": {"attachment; filename=\"caf\xe9.txt\""},
				"X-Legacy":            {"a\x00b", "\xff\xfe\xc3"},
				"X-Caf\xe9":           {"\xed\xa0\x80"},
			},
			Body: []byte("x"),
		}},
		{"Minimal", idem.StateRejected, idem.Response{StatusCode: http.StatusUnprocessableEntity}},
		{"EmptyBody", idem.StateSucceeded, idem.Response{StatusCode: http.StatusNoContent, Body: []byte{}, Header: http.Header{}}},
		{"WhileUnknown", idem.StateUnknown, idem.Response{StatusCode: http.StatusConflict, Body: []byte("in progress")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := createIn(t, j, "tenant-a", idem.StateInFlight)
			next := journal.CloneRecord(rec)
			next.State = tc.state
			resp := tc.resp
			next.Response = &resp
			got := update(t, j, next, idem.Durable)
			assertResponse(t, &tc.resp, got.Response)
			stored := get(t, j, rec.Key)
			assertResponse(t, &tc.resp, stored.Response)
			assertSameRecord(t, got, stored)
		})
	}
}

func testUpdateClearsLease(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	for _, to := range []idem.State{idem.StateSucceeded, idem.StateRejected, idem.StateExpired, idem.StateCanceled} {
		t.Run(to.String(), func(t *testing.T) {
			rec := create(t, j, newRecord("tenant-a"))
			held, err := j.Acquire(ctx, rec.Key, "worker-1", longLease)
			require.NoError(t, err)

			if to != idem.StateCanceled {
				// Staying active keeps the lease.
				next := journal.CloneRecord(held)
				next.State = idem.StateInFlight
				next.Attempts = 1
				held = update(t, j, next, idem.Durable)
				assertLease(t, held.Lease, get(t, j, rec.Key).Lease, "Lease while active")
				require.Equal(t, "worker-1", held.Lease.Owner, "an active record keeps its lease")
			}

			next := journal.CloneRecord(held)
			next.State = to
			got := update(t, j, next, idem.Durable)
			assert.Empty(t, got.Lease.Owner, "Lease.Owner of a %s record", to)
			assert.False(t, got.Lease.Held(time.Now()), "a %s record is not leased", to)
			requireStored(t, j, got)

			_, err = j.Acquire(ctx, rec.Key, "worker-2", longLease)
			require.ErrorIs(t, err, idem.ErrNotActive)
		})
	}
}

func testUpdateAttemptsDown(t *testing.T, j idem.Journal) {
	rec := create(t, j, newRecord("tenant-a"))
	next := journal.CloneRecord(rec)
	next.State = idem.StateInFlight
	next.Attempts = 2
	two := update(t, j, next, idem.Durable)

	next = journal.CloneRecord(two)
	next.Attempts = 1
	_, err := j.Update(t.Context(), next, idem.Durable, idem.Event{})
	require.ErrorIs(t, err, idem.ErrInvalidRecord)
	requireStored(t, j, two)

	next.Attempts = 2 // the same count is fine
	next.State = idem.StateUnknown
	got := update(t, j, next, idem.Durable)
	assert.Equal(t, 2, got.Attempts)
}

func testUpdateDurability(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	for _, order := range [][2]idem.Durability{
		{idem.Durable, idem.Deferred}, {idem.Deferred, idem.Durable}, {idem.Deferred, idem.Deferred},
		{idem.Durable, idem.Buffered}, {idem.Buffered, idem.Durable}, {idem.Buffered, idem.Buffered},
		{idem.Buffered, idem.Deferred},
	} {
		t.Run(fmt.Sprintf("%s_then_%s", order[0], order[1]), func(t *testing.T) {
			rec := create(t, j, newRecord("tenant-a"))

			next := journal.CloneRecord(rec)
			next.State = idem.StateInFlight
			next.Attempts = 1
			first, err := j.Update(ctx, next, order[0], idem.Event{})
			require.NoError(t, err)
			requireStored(t, j, first)

			next = journal.CloneRecord(first)
			next.State = idem.StateSucceeded
			next.Response = &idem.Response{StatusCode: http.StatusOK, Body: []byte("ok")}
			second, err := j.Update(ctx, next, order[1], idem.Event{})
			require.NoError(t, err)
			assert.Equal(t, rec.Version+2, second.Version)
			requireStored(t, j, second)
			byOp, err := j.Lookup(ctx, rec.Scope, rec.ID)
			require.NoError(t, err)
			assertSameRecord(t, second, byOp)
		})
	}
}

// testUpdateBufferedIsReadAtOnce: a buffered write may not be committed
// yet, but every read through the same journal sees it.
func testUpdateBufferedIsReadAtOnce(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	rec := create(t, j, newRecord("tenant-buffered"))
	next := journal.CloneRecord(rec)
	next.State = idem.StateSucceeded
	next.Response = &idem.Response{StatusCode: http.StatusCreated, Body: []byte(`{"id":7}`)}
	done, err := j.Update(ctx, next, idem.Buffered, idem.Event{})
	require.NoError(t, err)

	got, err := j.Get(ctx, rec.Key)
	require.NoError(t, err)
	assertSameRecord(t, done, got)
	got, err = j.Lookup(ctx, rec.Scope, rec.ID)
	require.NoError(t, err)
	assertSameRecord(t, done, got)
	var listed []idem.Record
	for r, err := range j.List(ctx, idem.Filter{Scope: "tenant-buffered", States: []idem.State{idem.StateSucceeded}}) {
		require.NoError(t, err)
		listed = append(listed, r)
	}
	require.Len(t, listed, 1, "List sees the buffered write")
	counts, err := j.Count(ctx)
	require.NoError(t, err)
	found := false
	for _, c := range counts {
		if c.Scope == "tenant-buffered" {
			assert.Equal(t, idem.StateSucceeded, c.State, "Count sees the buffered write")
			found = true
		}
	}
	assert.True(t, found)
	evs, err := j.History(ctx, rec.Key)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	assert.Equal(t, idem.StateSucceeded, evs[len(evs)-1].To, "History sees the buffered write")

	// A buffered write is checked when it is made, like any other.
	_, err = j.Update(ctx, next, idem.Buffered, idem.Event{})
	require.ErrorIs(t, err, idem.ErrConflict, "a stale version is refused at once, not when committed")
}

func testUpdateInvalidDurability(t *testing.T, j idem.Journal) {
	rec := create(t, j, newRecord("tenant-a"))
	next := journal.CloneRecord(rec)
	next.State = idem.StateInFlight
	_, err := j.Update(t.Context(), next, idem.Durability(9), idem.Event{})
	require.ErrorIs(t, err, idem.ErrInvalidRecord)
	assert.Contains(t, err.Error(), "durability 9")
	requireStored(t, j, rec)
}

func testUpdateNotFound(t *testing.T, j idem.Journal) {
	rec := newRecord("tenant-a")
	rec.Version = 1
	rec.State = idem.StateInFlight
	_, err := j.Update(t.Context(), rec, idem.Durable, idem.Event{})
	require.ErrorIs(t, err, idem.ErrNotFound)
	requireGone(t, j, rec)

	stored := create(t, j, newRecord("tenant-a"))
	other := journal.CloneRecord(stored)
	other.Key = uuid.NewString()
	other.State = idem.StateInFlight
	_, err = j.Update(t.Context(), other, idem.Durable, idem.Event{})
	require.ErrorIs(t, err, idem.ErrNotFound, "Update finds the record by key, not by operation ID")
	requireStored(t, j, stored)
}

// testUpdateSync: Sync succeeds with buffered and deferred writes pending,
// and they are all there after it. (That they are on disk is for each
// journal's own tests to show.)
func testUpdateSync(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	a := create(t, j, newRecord("tenant-a"))
	b := create(t, j, newRecord("tenant-a"))
	next := journal.CloneRecord(a)
	next.State = idem.StateInFlight
	next.Attempts = 1
	wa := update(t, j, next, idem.Buffered)
	next = journal.CloneRecord(b)
	next.State = idem.StateCanceled
	wb := update(t, j, next, idem.Deferred)
	require.NoError(t, j.Sync(ctx))
	require.NoError(t, j.Sync(ctx), "Sync with nothing pending")
	requireStored(t, j, wa)
	requireStored(t, j, wb)
}
