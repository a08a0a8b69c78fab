package journaltest

import (
	"crypto/rand"
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

func testCreateNewRecord(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	now := time.Now()
	rec := newRecord("tenant-a")
	rec.State = idem.StateInFlight
	rec.Attempts = 1
	rec.NextAttemptAt = now.Add(time.Hour)
	rec.ExpiresAt = now.Add(24 * time.Hour)
	rec.LastError = "previous attempt"
	rec.Note = "created by the test"
	rec.Lease = idem.Lease{Owner: "worker-1", Epoch: 7, ExpiresAt: now.Add(longLease)}
	// The journal fills these in, whatever the caller says.
	rec.Version = 42
	rec.CreatedAt = time.Date(2000, 1, 2, 3, 4, 5, 0, time.UTC)
	rec.UpdatedAt = rec.CreatedAt

	before := time.Now()
	got, created, err := j.Create(ctx, rec)
	after := time.Now()
	require.NoError(t, err)
	require.True(t, created, "created")

	assert.Equal(t, int64(1), got.Version, "Version")
	assertBetween(t, got.CreatedAt, before, after, "CreatedAt")
	assert.True(t, got.UpdatedAt.Equal(got.CreatedAt), "UpdatedAt %v != CreatedAt %v", got.UpdatedAt, got.CreatedAt)
	assertLease(t, idem.Lease{Owner: "worker-1", Epoch: 1, ExpiresAt: rec.Lease.ExpiresAt}, got.Lease, "Lease")
	assertRequest(t, rec, got)
	assert.Equal(t, idem.StateInFlight, got.State, "State")
	assert.Equal(t, 1, got.Attempts, "Attempts")
	assertTime(t, rec.NextAttemptAt, got.NextAttemptAt, "NextAttemptAt")
	assertTime(t, rec.ExpiresAt, got.ExpiresAt, "ExpiresAt")
	assert.Equal(t, rec.LastError, got.LastError, "LastError")
	assert.Equal(t, rec.Note, got.Note, "Note")
	assert.Nil(t, got.Response, "Response")

	requireStored(t, j, got)
	byOp, err := j.Lookup(ctx, rec.Scope, rec.ID)
	require.NoError(t, err)
	assertSameRecord(t, got, byOp)

	// Without an owner the record is not leased, whatever else Lease says.
	unleased := newRecord("tenant-a")
	unleased.Lease = idem.Lease{Epoch: 5, ExpiresAt: now.Add(longLease)}
	got = create(t, j, unleased)
	assert.Equal(t, idem.Lease{}, got.Lease, "Lease of a record created without an owner")
	assert.Equal(t, int64(1), got.Version, "Version")
	assert.True(t, got.NextAttemptAt.IsZero(), "NextAttemptAt stays zero")
	assert.True(t, got.ExpiresAt.IsZero(), "ExpiresAt stays zero")
	requireStored(t, j, got)
}

func testCreateRoundTrip(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	allBytes := make([]byte, 256)
	for i := range allBytes {
		allBytes[i] = byte(i)
	}
	maxBody := make([]byte, idem.DefaultMaxBodySize)
	_, _ = rand.Read(maxBody)

	cases := []struct {
		name   string
		method string
		body   []byte
	}{
		{"EmptyBody", http.MethodPost, []byte{}},
		{"NilBody", http.MethodDelete, nil},
		{"NULBytes", http.MethodPut, []byte{0, 0, 'a', 0, 'b', 0}},
		{"NotUTF8", http.MethodPatch, []byte{0xff, 0xfe, 0xfd, 0x80, 0xc3, 0x28, 0xed, 0xa0, 0x80, '\n'}},
		{"AllByteValues", http.MethodPost, allBytes},
		{"MaxSize", http.MethodPost, maxBody},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecord("tenant-a")
			rec.Method = tc.method
			rec.URL = "https://api.example.test/v1/orders/%E2%82%AC?expand=items&expand=customer#frag"
			rec.Body = tc.body
			rec.Fingerprint = fingerprint(tc.body)
			rec.Header = http.Header{
				"Content-Type":    {"application/octet-stream"},
				"Accept":          {"application/json", "text/plain;q=0.5", "*/*;q=0.1"},
				"X-Empty":         {""},
				"X-Comma":         {"a, b", "c"},
				"X-Request-Notes": {"ünïcode ✓", "tab\there"},
				"X-Latin1":        {"caf\xe9", "a\x00b\xff"}, // obs-text, which HTTP allows
			}
			got, created, err := j.Create(ctx, rec)
			require.NoError(t, err)
			require.True(t, created)
			assertRequest(t, rec, got)
			assert.Len(t, got.Body, len(tc.body), "Body length")

			stored := get(t, j, rec.Key)
			assertRequest(t, rec, stored)
			assert.Len(t, stored.Body, len(tc.body), "stored Body length")
			byOp, err := j.Lookup(ctx, rec.Scope, rec.ID)
			require.NoError(t, err)
			assertRequest(t, rec, byOp)
		})
	}
}

func testCreateExisting(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	first := create(t, j, newRecord("tenant-a"))

	// The same operation again, proposing another key and, under the same
	// fingerprint, other request fields: the first record wins untouched.
	again := journal.CloneRecord(first)
	again.Key = uuid.NewString()
	again.Method = http.MethodPut
	again.URL = "https://api.example.test/other"
	again.Header = http.Header{"X-Other": {"1"}}
	again.Body = []byte("another body")
	again.State = idem.StateInFlight
	again.Lease = idem.Lease{Owner: "worker-2", ExpiresAt: time.Now().Add(longLease)}
	got, created, err := j.Create(ctx, again)
	require.NoError(t, err)
	assert.False(t, created, "created")
	assert.Equal(t, first.Key, got.Key, "the existing key, not the proposed one")
	assertSameRecord(t, first, got)
	requireStored(t, j, first)
	_, err = j.Get(ctx, again.Key)
	require.ErrorIs(t, err, idem.ErrNotFound, "the proposed key must not be stored")

	// Create returns the record as it is now, not as it was created.
	moved := journal.CloneRecord(first)
	moved.State = idem.StateInFlight
	moved.Attempts = 1
	moved = update(t, j, moved, idem.Durable)
	again.Key = uuid.NewString()
	got, created, err = j.Create(ctx, again)
	require.NoError(t, err)
	assert.False(t, created, "created")
	assertSameRecord(t, moved, got)

	assert.Equal(t, []string{first.Key}, listKeys(t, j, idem.Filter{}), "one record")
	assert.Len(t, history(t, j, first.Key), 2, "no event for a Create that found the record")
}

func testCreateFingerprintMismatch(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	first := create(t, j, newRecord("tenant-a"))
	next := journal.CloneRecord(first)
	next.State = idem.StateInFlight
	next.Attempts = 1
	next.LastError = "kept"
	stored := update(t, j, next, idem.Durable)

	other := newRecord("tenant-a")
	other.ID = first.ID
	other.Body = []byte(`{"order":"different"}`)
	other.Fingerprint = fingerprint(other.Body)
	got, created, err := j.Create(ctx, other)
	require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
	assert.False(t, created, "created")
	assert.Equal(t, first.Key, got.Key, "Create returns the existing record with the mismatch")
	assert.Equal(t, first.Fingerprint, got.Fingerprint, "returned Fingerprint")

	requireStored(t, j, stored)
	_, err = j.Get(ctx, other.Key)
	require.ErrorIs(t, err, idem.ErrNotFound, "the other request must not be stored")
	assert.Len(t, history(t, j, first.Key), 2, "no event for a refused Create")
	assert.Equal(t, []string{first.Key}, listKeys(t, j, idem.Filter{}), "one record")
}

func testCreateDuplicateKey(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	first := create(t, j, newRecord("tenant-a"))
	for _, scope := range []string{"tenant-a", "tenant-b"} {
		other := newRecord(scope)
		other.Key = first.Key
		_, created, err := j.Create(ctx, other)
		require.ErrorIs(t, err, idem.ErrDuplicateKey, "key of %s/%s reused for %s/%s", first.Scope, first.ID, other.Scope, other.ID)
		assert.False(t, created, "created")
		_, err = j.Lookup(ctx, other.Scope, other.ID)
		require.ErrorIs(t, err, idem.ErrNotFound, "the refused operation must not be stored")
	}
	requireStored(t, j, first)
	assert.Equal(t, []string{first.Key}, listKeys(t, j, idem.Filter{}), "one record")
}

func testCreateSameIDOtherScope(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	a := create(t, j, newRecord("tenant-a"))

	// The same ID and the same request in another scope.
	same := newRecord("tenant-b")
	same.ID, same.Body, same.Fingerprint = a.ID, a.Body, a.Fingerprint
	// The same ID and another request in a third scope.
	other := newRecord("tenant-c")
	other.ID = a.ID
	for _, rec := range []idem.Record{same, other} {
		got, created, err := j.Create(ctx, rec)
		require.NoError(t, err, "the same ID in scope %s", rec.Scope)
		require.True(t, created, "the same ID in scope %s is another operation", rec.Scope)
		assert.Equal(t, rec.Key, got.Key)

		byOp, err := j.Lookup(ctx, rec.Scope, a.ID)
		require.NoError(t, err)
		assert.Equal(t, rec.Key, byOp.Key, "Lookup in scope %s", rec.Scope)
	}
	got, err := j.Lookup(ctx, "tenant-a", a.ID)
	require.NoError(t, err)
	assertSameRecord(t, a, got)
	assert.Equal(t, []string{a.Key, same.Key, other.Key}, listKeys(t, j, idem.Filter{}))
}

func testCreateInvalid(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	cases := []struct {
		name   string
		mutate func(*idem.Record)
		want   error
	}{
		{"EmptyKey", func(r *idem.Record) { r.Key = "" }, idem.ErrInvalidRecord},
		{"EmptyScope", func(r *idem.Record) { r.Scope = "" }, idem.ErrInvalidRecord},
		{"EmptyID", func(r *idem.Record) { r.ID = "" }, idem.ErrInvalidRecord},
		{"EmptyMethod", func(r *idem.Record) { r.Method = "" }, idem.ErrInvalidRecord},
		{"EmptyURL", func(r *idem.Record) { r.URL = "" }, idem.ErrInvalidRecord},
		{"EmptyFingerprint", func(r *idem.Record) { r.Fingerprint = "" }, idem.ErrInvalidRecord},
		{"EmptyKeyHeader", func(r *idem.Record) { r.KeyHeader = "" }, idem.ErrInvalidRecord},
		{"NegativeTransportResends", func(r *idem.Record) { r.TransportResends = -1 }, idem.ErrInvalidRecord},
		{"ZeroState", func(r *idem.Record) { r.State = 0 }, idem.ErrInvalidRecord},
		{"UndefinedState", func(r *idem.Record) { r.State = 99 }, idem.ErrInvalidRecord},
		{"Unknown", func(r *idem.Record) { r.State = idem.StateUnknown }, idem.ErrInvalidRecord},
		{"Succeeded", func(r *idem.Record) { r.State = idem.StateSucceeded }, idem.ErrInvalidRecord},
		{"Rejected", func(r *idem.Record) { r.State = idem.StateRejected }, idem.ErrInvalidRecord},
		{"Expired", func(r *idem.Record) { r.State = idem.StateExpired }, idem.ErrInvalidRecord},
		{"Canceled", func(r *idem.Record) { r.State = idem.StateCanceled }, idem.ErrInvalidRecord},
		{"WithResponse", func(r *idem.Record) { r.Response = &idem.Response{StatusCode: http.StatusCreated} }, idem.ErrInvalidRecord},
		{"NegativeAttempts", func(r *idem.Record) { r.Attempts = -1 }, idem.ErrInvalidRecord},
		{"LeaseAlreadyExpired", func(r *idem.Record) {
			r.Lease = idem.Lease{Owner: "worker-1", ExpiresAt: time.Now().Add(-time.Second)}
		}, idem.ErrInvalidRecord},
		{"LeaseWithoutExpiry", func(r *idem.Record) { r.Lease = idem.Lease{Owner: "worker-1"} }, idem.ErrInvalidRecord},
		{"LinkTooLong", func(r *idem.Record) { r.Link = strings.Repeat("x", idem.MaxLinkLength+1) }, idem.ErrInvalidRecord},
		{"BodyTooLarge", func(r *idem.Record) {
			r.Body = make([]byte, idem.DefaultMaxBodySize+1)
			r.Fingerprint = fingerprint(r.Body)
		}, idem.ErrBodyTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecord("tenant-invalid")
			tc.mutate(&rec)
			_, created, err := j.Create(ctx, rec)
			require.ErrorIs(t, err, tc.want)
			assert.False(t, created, "created")
			requireGone(t, j, rec)
		})
	}
	assert.Empty(t, listKeys(t, j, idem.Filter{}), "nothing stored")
	counts, err := j.Count(ctx)
	require.NoError(t, err)
	assert.Empty(t, counts, "nothing counted")
}

func testGetLookup(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	a := create(t, j, newRecord("tenant-a"))
	b := create(t, j, newRecord("tenant-b"))
	for _, rec := range []idem.Record{a, b} {
		got, err := j.Get(ctx, rec.Key)
		require.NoError(t, err)
		assertSameRecord(t, rec, got)
		got, err = j.Lookup(ctx, rec.Scope, rec.ID)
		require.NoError(t, err)
		assertSameRecord(t, rec, got)
	}
}

func testReadNotFound(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	a := create(t, j, newRecord("tenant-a"))
	_, err := j.Get(ctx, uuid.NewString())
	require.ErrorIs(t, err, idem.ErrNotFound, "Get of an unknown key")
	_, err = j.Get(ctx, a.ID)
	require.ErrorIs(t, err, idem.ErrNotFound, "Get by operation ID is not Get by key")
	_, err = j.Lookup(ctx, "tenant-a", "op-unknown")
	require.ErrorIs(t, err, idem.ErrNotFound, "Lookup of an unknown ID")
	_, err = j.Lookup(ctx, "tenant-b", a.ID)
	require.ErrorIs(t, err, idem.ErrNotFound, "Lookup of the ID in another scope")
	_, err = j.Lookup(ctx, "tenant-a", a.Key)
	require.ErrorIs(t, err, idem.ErrNotFound, "Lookup by key is not Lookup by ID")
}

func testReturnsCopies(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	rec := newRecord("tenant-a")
	rec.Header = http.Header{"Accept": {"application/json", "text/plain"}}
	want := journal.CloneRecord(rec)
	got := create(t, j, rec)
	want.Version, want.CreatedAt, want.UpdatedAt = got.Version, got.CreatedAt, got.UpdatedAt

	// Changing what was passed to Create or what came back changes nothing
	// stored.
	rec.Body[0] = 'X'
	rec.Header["Accept"][0] = "changed/input"
	got.Body[0] = 'Y'
	got.Header["Accept"][1] = "changed/output"
	got.Header.Set("X-Added", "1")
	requireStored(t, j, want)

	read := get(t, j, want.Key)
	read.Body[1] = 'Z'
	read.Header["Accept"][0] = "changed/read"
	requireStored(t, j, want)

	// So do the request in what Acquire and Update return.
	acquired, err := j.Acquire(ctx, want.Key, "owner-a", time.Minute)
	require.NoError(t, err)
	want = journal.CloneRecord(acquired)
	acquired.Body[0] = 'A'
	acquired.Header["Accept"][1] = "changed/acquired"
	requireStored(t, j, want)

	next := journal.CloneRecord(want)
	next.State = idem.StateSucceeded
	next.Response = &idem.Response{StatusCode: 201, Header: http.Header{"Location": {"/orders/1"}}, Body: []byte(`{"id":1}`)}
	updated := update(t, j, next, idem.Durable)
	want = journal.CloneRecord(updated)
	updated.Body[0] = 'U'
	updated.Header["Accept"][0] = "changed/updated"
	requireStored(t, j, want)
	wantResp := *next.Response
	wantResp.Header = http.Header{"Location": {"/orders/1"}}
	wantResp.Body = []byte(`{"id":1}`)
	next.Response.Body[0] = 'X'
	next.Response.Header["Location"][0] = "/changed"
	want.Response.Body[1] = 'X'
	want.Response.Header["Location"][0] = "/changed/too"
	want.Response = &wantResp
	requireStored(t, j, want)

	byOp, err := j.Lookup(ctx, want.Scope, want.ID)
	require.NoError(t, err)
	byOp.Response.Body[0] = 'Q'
	requireStored(t, j, want)
}

// testCreateKeyWireForm: the key's wire form is part of the record, stored
// as given and never changed by an update.
func testCreateKeyWireForm(t *testing.T, j idem.Journal) {
	for _, form := range []struct {
		header string
		quoted bool
	}{{"Idempotency-Key", false}, {"Idempotency-Key", true}, {"X-Request-Key", false}, {"X-Request-Key", true}} {
		rec := newRecord("tenant-a")
		rec.KeyHeader, rec.KeyQuoted = form.header, form.quoted
		got := create(t, j, rec)
		assertRequest(t, rec, got)
		assertRequest(t, rec, get(t, j, rec.Key))

		next := journal.CloneRecord(got)
		next.State = idem.StateInFlight
		next.KeyHeader, next.KeyQuoted = "Other-Header", !form.quoted
		next.TransportResends = 3
		updated := update(t, j, next, idem.Durable)
		assertRequest(t, rec, updated)
		stored := get(t, j, rec.Key)
		assertRequest(t, rec, stored)
		assert.Equal(t, 3, stored.TransportResends, "the re-sends are kept beside the form")
	}
}

// testCreateLink: the link to the creating trace is stored as given (empty
// too), read back by every read, kept by claims and never changed by an
// update.
func testCreateLink(t *testing.T, j idem.Journal) {
	for _, link := range []string{"", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", strings.Repeat("l", idem.MaxLinkLength)} {
		rec := newRecord("tenant-link")
		rec.Link = link
		got := create(t, j, rec)
		assert.Equal(t, link, got.Link, "Create's copy")
		assert.Equal(t, link, get(t, j, rec.Key).Link, "Get")

		next := journal.CloneRecord(got)
		next.State = idem.StateInFlight
		next.Link = "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01"
		assert.Equal(t, link, update(t, j, next, idem.Durable).Link, "Update's copy: the link never changes")
		acquired := acquire(t, j, rec.Key, "worker-link", longLease)
		assert.Equal(t, link, acquired.Link, "Acquire")
		found, err := j.Lookup(t.Context(), rec.Scope, rec.ID)
		require.NoError(t, err)
		assert.Equal(t, link, found.Link, "Lookup")
	}
	for rec, err := range j.List(t.Context(), idem.Filter{Scope: "tenant-link"}) {
		require.NoError(t, err)
		assert.NotEqual(t, "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01", rec.Link, "List")
	}
}
