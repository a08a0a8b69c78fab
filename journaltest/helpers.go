package journaltest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/journal"
)

// newRecord returns a valid pending record in scope with a random key and
// operation ID, ready for Create.
func newRecord(scope string) idem.Record {
	body := fmt.Appendf(nil, `{"order":%q,"amount_cents":4200}`, uuid.NewString())
	return idem.Record{
		Key:         uuid.NewString(),
		Scope:       scope,
		ID:          "op-" + uuid.NewString(),
		Method:      http.MethodPost,
		URL:         "https://api.example.test/v1/orders",
		Header:      http.Header{"Content-Type": {"application/json"}},
		Body:        body,
		Fingerprint: fingerprint(body),
		KeyHeader:   "Idempotency-Key",
		Link:        "00-" + strings.ReplaceAll(uuid.NewString(), "-", "") + "-00f067aa0ba902b7-01",
		State:       idem.StatePending,
	}
}

// fingerprint is the hex SHA-256 of body.
func fingerprint(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

// create stores rec, which must be new.
func create(t *testing.T, j idem.Journal, rec idem.Record) idem.Record {
	t.Helper()
	got, created, err := j.Create(t.Context(), rec)
	require.NoError(t, err, "Create %s/%s", rec.Scope, rec.ID)
	require.True(t, created, "Create %s/%s: created", rec.Scope, rec.ID)
	return got
}

// createIn creates a new record in scope and moves it to state.
func createIn(t *testing.T, j idem.Journal, scope string, state idem.State) idem.Record {
	t.Helper()
	rec := create(t, j, newRecord(scope))
	if state != idem.StatePending {
		rec = moveTo(t, j, rec, state)
	}
	return rec
}

// update applies rec, which must succeed.
func update(t *testing.T, j idem.Journal, rec idem.Record, d idem.Durability) idem.Record {
	t.Helper()
	got, err := j.Update(t.Context(), rec, d, idem.Event{})
	require.NoError(t, err, "Update %s to %s at version %d", rec.Key, rec.State, rec.Version)
	return got
}

// moveTo updates rec, as read, to state.
func moveTo(t *testing.T, j idem.Journal, rec idem.Record, state idem.State) idem.Record {
	t.Helper()
	next := journal.CloneRecord(rec)
	next.State = state
	return update(t, j, next, idem.Durable)
}

func get(t *testing.T, j idem.Journal, key string) idem.Record {
	t.Helper()
	rec, err := j.Get(t.Context(), key)
	require.NoError(t, err, "Get %s", key)
	return rec
}

func history(t *testing.T, j idem.Journal, key string) []idem.Event {
	t.Helper()
	evs, err := j.History(t.Context(), key)
	require.NoError(t, err, "History %s", key)
	return evs
}

// requireGone checks that no record has rec's key or (scope, id).
func requireGone(t *testing.T, j idem.Journal, rec idem.Record) {
	t.Helper()
	_, err := j.Lookup(t.Context(), rec.Scope, rec.ID)
	require.ErrorIs(t, err, idem.ErrNotFound, "Lookup %s/%s", rec.Scope, rec.ID)
	if rec.Key != "" {
		_, err = j.Get(t.Context(), rec.Key)
		require.ErrorIs(t, err, idem.ErrNotFound, "Get %s", rec.Key)
	}
}

// waitPast waits until the clock has moved past ts by more than the
// tolerance of time comparisons, so that a record written afterwards has a
// stored time that is later than ts and tells apart from it.
func waitPast(t *testing.T, ts time.Time) {
	t.Helper()
	require.Eventually(t, func() bool { return time.Now().UnixMilli() > ts.Add(ms).UnixMilli() },
		waitFor, time.Millisecond, "the clock did not move past %s", ts)
}

// waitExpired waits until the lease l has run out.
func waitExpired(t *testing.T, l idem.Lease) {
	t.Helper()
	require.NotEmpty(t, l.Owner, "the record is not leased")
	require.Eventually(t, func() bool { return !l.Held(time.Now()) },
		waitFor, pollEvery, "the lease of %s did not run out", l.Owner)
}

// within runs fn and fails the test if it has not returned when the test
// binary is about to time out (go test -timeout), for calls that must not
// hang or deadlock. fn runs on another goroutine: it must not call require
// or t.FailNow.
//
// A hang never returns, while a correct journal on a loaded machine may
// take many seconds: no shorter bound tells the two apart without failing
// the slow one. Waiting to the binary's own deadline fails a hang with a
// message that says what hung, rather than with the binary's panic.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-hung(t):
		t.Fatalf("%s did not return before the test binary's deadline: the journal hangs or deadlocks", what)
	}
}

// hung fires shortly before the test binary's deadline, when it has one,
// leaving time to report what hung and to clean up; never otherwise.
func hung(t *testing.T) <-chan time.Time {
	dl, ok := t.Deadline()
	if !ok {
		return nil
	}
	left := time.Until(dl)
	return time.After(left - min(left/10, 30*time.Second))
}

// listKeys returns the keys List yields for f, in order.
func listKeys(t *testing.T, j idem.Journal, f idem.Filter) []string {
	t.Helper()
	var keys []string
	for rec, err := range j.List(t.Context(), f) {
		require.NoError(t, err, "List %+v", f)
		keys = append(keys, rec.Key)
	}
	return keys
}

func keysOf(recs ...idem.Record) []string {
	keys := make([]string, len(recs))
	for i, r := range recs {
		keys[i] = r.Key
	}
	return keys
}

// assertTime checks that got is want at the journal's precision; a zero
// want must stay zero.
func assertTime(t *testing.T, want, got time.Time, field string) bool {
	t.Helper()
	if want.IsZero() || got.IsZero() {
		return assert.True(t, got.IsZero() == want.IsZero(), "%s: want %v, got %v", field, want, got)
	}
	return assert.WithinDuration(t, want, got, ms, field)
}

// assertBetween checks that lo <= got <= hi at the journal's precision.
func assertBetween(t *testing.T, got, lo, hi time.Time, field string) bool {
	t.Helper()
	return assert.WithinRange(t, got, lo.Add(-ms), hi.Add(ms), field)
}

// assertHeader compares headers, taking nil and empty as equal.
func assertHeader(t *testing.T, want, got http.Header, field string) bool {
	t.Helper()
	if len(want) == 0 && len(got) == 0 {
		return true
	}
	return assert.Equal(t, want, got, field)
}

// assertBytes compares byte slices exactly, taking nil and empty as equal.
func assertBytes(t *testing.T, want, got []byte, field string) bool {
	t.Helper()
	if bytes.Equal(want, got) {
		return true
	}
	return assert.Equal(t, want, got, field) // reports the difference
}

// assertRequest checks the request fields, which never change.
func assertRequest(t *testing.T, want, got idem.Record) bool {
	t.Helper()
	ok := assert.Equal(t, want.Key, got.Key, "Key")
	ok = assert.Equal(t, want.Scope, got.Scope, "Scope") && ok
	ok = assert.Equal(t, want.ID, got.ID, "ID") && ok
	ok = assert.Equal(t, want.Method, got.Method, "Method") && ok
	ok = assert.Equal(t, want.URL, got.URL, "URL") && ok
	ok = assertHeader(t, want.Header, got.Header, "Header") && ok
	ok = assertBytes(t, want.Body, got.Body, "Body") && ok
	ok = assert.Equal(t, want.Fingerprint, got.Fingerprint, "Fingerprint") && ok
	ok = assert.Equal(t, want.KeyHeader, got.KeyHeader, "KeyHeader") && ok
	ok = assert.Equal(t, want.KeyQuoted, got.KeyQuoted, "KeyQuoted") && ok
	ok = assert.Equal(t, want.Link, got.Link, "Link") && ok
	return ok
}

// assertLease compares leases at the journal's precision.
func assertLease(t *testing.T, want, got idem.Lease, field string) bool {
	t.Helper()
	ok := assert.Equal(t, want.Owner, got.Owner, field+".Owner")
	ok = assert.Equal(t, want.Epoch, got.Epoch, field+".Epoch") && ok
	return assertTime(t, want.ExpiresAt, got.ExpiresAt, field+".ExpiresAt") && ok
}

// assertResponse compares responses; nil only equals nil.
func assertResponse(t *testing.T, want, got *idem.Response) bool {
	t.Helper()
	if want == nil || got == nil {
		return assert.True(t, want == nil && got == nil, "Response: want %+v, got %+v", want, got)
	}
	ok := assert.Equal(t, want.StatusCode, got.StatusCode, "Response.StatusCode")
	ok = assertHeader(t, want.Header, got.Header, "Response.Header") && ok
	ok = assertBytes(t, want.Body, got.Body, "Response.Body") && ok
	return assert.Equal(t, want.Replayed, got.Replayed, "Response.Replayed") && ok
}

// assertSameRecord compares every field of two records, times at the
// journal's precision.
func assertSameRecord(t *testing.T, want, got idem.Record) bool {
	t.Helper()
	ok := assertRequest(t, want, got)
	ok = assert.Equal(t, want.State, got.State, "State") && ok
	ok = assert.Equal(t, want.Attempts, got.Attempts, "Attempts") && ok
	ok = assertTime(t, want.NextAttemptAt, got.NextAttemptAt, "NextAttemptAt") && ok
	ok = assertLease(t, want.Lease, got.Lease, "Lease") && ok
	ok = assertResponse(t, want.Response, got.Response) && ok
	ok = assert.Equal(t, want.LastError, got.LastError, "LastError") && ok
	ok = assert.Equal(t, want.Note, got.Note, "Note") && ok
	ok = assertTime(t, want.CreatedAt, got.CreatedAt, "CreatedAt") && ok
	ok = assertTime(t, want.UpdatedAt, got.UpdatedAt, "UpdatedAt") && ok
	ok = assertTime(t, want.ExpiresAt, got.ExpiresAt, "ExpiresAt") && ok
	return assert.Equal(t, want.Version, got.Version, "Version") && ok
}

// requireStored checks that the stored record is want.
func requireStored(t *testing.T, j idem.Journal, want idem.Record) {
	t.Helper()
	if !assertSameRecord(t, want, get(t, j, want.Key)) {
		t.FailNow()
	}
}
