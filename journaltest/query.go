package journaltest

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/journal"
)

func testListFilters(t *testing.T, j idem.Journal) {
	a1 := createIn(t, j, "tenant-a", idem.StatePending)
	a2 := createIn(t, j, "tenant-a", idem.StateSucceeded)
	b1 := createIn(t, j, "tenant-b", idem.StatePending)
	b2 := createIn(t, j, "tenant-b", idem.StateUnknown)
	a3 := createIn(t, j, "tenant-a", idem.StateExpired)
	waitPast(t, a3.CreatedAt)
	b3 := createIn(t, j, "tenant-b", idem.StatePending)
	cut := b3.CreatedAt

	for _, tc := range []struct {
		name string
		f    idem.Filter
		want []idem.Record
	}{
		{"Zero", idem.Filter{}, []idem.Record{a1, a2, b1, b2, a3, b3}},
		{"Scope", idem.Filter{Scope: "tenant-a"}, []idem.Record{a1, a2, a3}},
		{"UnknownScope", idem.Filter{Scope: "tenant-c"}, nil},
		{"OneState", idem.Filter{States: []idem.State{idem.StatePending}}, []idem.Record{a1, b1, b3}},
		{"States", idem.Filter{States: []idem.State{idem.StateSucceeded, idem.StateExpired}}, []idem.Record{a2, a3}},
		{"AbsentState", idem.Filter{States: []idem.State{idem.StateCanceled}}, nil},
		{"ScopeAndStates", idem.Filter{Scope: "tenant-b", States: []idem.State{idem.StatePending, idem.StateUnknown}}, []idem.Record{b1, b2, b3}},
		{"CreatedBefore", idem.Filter{CreatedBefore: cut}, []idem.Record{a1, a2, b1, b2, a3}},
		{"CreatedBeforeIsStrict", idem.Filter{CreatedBefore: a1.CreatedAt}, nil},
		{"CreatedBeforeAll", idem.Filter{CreatedBefore: cut.Add(time.Millisecond)}, []idem.Record{a1, a2, b1, b2, a3, b3}},
		{"Everything", idem.Filter{Scope: "tenant-b", States: []idem.State{idem.StatePending}, CreatedBefore: cut}, []idem.Record{b1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []idem.Record
			for rec, err := range j.List(t.Context(), tc.f) {
				require.NoError(t, err)
				got = append(got, rec)
			}
			require.Equal(t, keysOf(tc.want...), keysOf(got...), "List %+v", tc.f)
			for i, rec := range got {
				want := get(t, j, tc.want[i].Key)
				assertSameRecord(t, want, rec)
			}
		})
	}
}

func testListOrder(t *testing.T, j idem.Journal) {
	var created []idem.Record
	for i := range 40 {
		rec := create(t, j, newRecord(fmt.Sprintf("tenant-%d", i%3)))
		created = append(created, rec)
		if i%4 == 0 {
			// Updating a record does not move it in the order.
			moveTo(t, j, created[i/2], idem.StateInFlight)
		}
	}
	assert.Equal(t, keysOf(created...), listKeys(t, j, idem.Filter{}), "List is in creation order")
}

func testListEarlyBreak(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	var created []idem.Record
	for range 10 {
		created = append(created, create(t, j, newRecord("tenant-a")))
	}
	for _, stop := range []int{1, 3, 9} {
		var keys []string
		var errs []error
		within(t, "List with an early break", func() {
			for rec, err := range j.List(ctx, idem.Filter{}) {
				if err != nil {
					errs = append(errs, err)
					break
				}
				keys = append(keys, rec.Key)
				if len(keys) == stop {
					break
				}
			}
		})
		require.Empty(t, errs)
		assert.Equal(t, keysOf(created[:stop]...), keys, "break after %d", stop)

		// The journal is still usable for reads and writes.
		var err error
		within(t, "Create after an early break", func() {
			var rec idem.Record
			rec, _, err = j.Create(ctx, newRecord("tenant-b"))
			if err == nil {
				next := journal.CloneRecord(rec)
				next.State = idem.StateInFlight
				_, err = j.Update(ctx, next, idem.Durable, idem.Event{})
			}
		})
		require.NoError(t, err, "write after an early break")
	}
	assert.Len(t, listKeys(t, j, idem.Filter{}), 13)
	assert.Equal(t, keysOf(created...), listKeys(t, j, idem.Filter{Scope: "tenant-a"}))
}

func testListThousand(t *testing.T, j idem.Journal) {
	const writers, each = 10, 100
	keys := make([][]string, writers)
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for range each {
				rec := newRecord([]string{"even", "odd"}[w%2])
				if _, _, err := j.Create(t.Context(), rec); err != nil {
					errs[w] = err
					return
				}
				keys[w] = append(keys[w], rec.Key)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}

	check := func(f idem.Filter, writersOf func(w int) bool, want int) {
		t.Helper()
		got := listKeys(t, j, f)
		assert.Len(t, got, want, "List %+v", f)
		pos := make(map[string]int, len(got))
		for i, k := range got {
			if prev, dup := pos[k]; dup {
				t.Errorf("List %+v yielded %s twice, at %d and %d", f, k, prev, i)
			}
			pos[k] = i
		}
		for w := range writers {
			if !writersOf(w) {
				continue
			}
			last := -1
			for _, k := range keys[w] {
				i, ok := pos[k]
				if !assert.True(t, ok, "List %+v missed %s", f, k) {
					continue
				}
				assert.Greater(t, i, last, "List %+v: %s is out of creation order", f, k)
				last = i
			}
		}
	}
	check(idem.Filter{}, func(int) bool { return true }, writers*each)
	check(idem.Filter{Scope: "odd"}, func(w int) bool { return w%2 == 1 }, writers*each/2)
}

func testListWrites(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	const n = 300
	want := map[string]bool{}
	for range n {
		want[create(t, j, newRecord("tenant-a")).Key] = true
	}

	seen := map[string]int{}
	var listErrs, writeErrs []error
	within(t, "List with writes during the iteration", func() {
		i := 0
		for rec, err := range j.List(ctx, idem.Filter{}) {
			if err != nil {
				listErrs = append(listErrs, err)
				break
			}
			seen[rec.Key]++
			if !want[rec.Key] {
				continue // created during the iteration
			}
			next := journal.CloneRecord(rec)
			next.State = idem.StateInFlight
			next.Attempts = 1
			if _, err := j.Update(ctx, next, idem.Deferred, idem.Event{}); err != nil {
				writeErrs = append(writeErrs, err)
			}
			if i++; i%50 == 0 {
				if _, _, err := j.Create(ctx, newRecord("tenant-a")); err != nil {
					writeErrs = append(writeErrs, err)
				}
			}
		}
	})
	require.Empty(t, listErrs, "List errors")
	require.Empty(t, writeErrs, "errors writing during List")
	for key := range want {
		assert.Equal(t, 1, seen[key], "times List yielded %s", key)
	}
	for key, times := range seen {
		assert.Equal(t, 1, times, "times List yielded %s", key)
	}
	inFlight := listKeys(t, j, idem.Filter{States: []idem.State{idem.StateInFlight}})
	assert.Len(t, inFlight, n, "every listed record was updated")
}

func testCount(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	first := createIn(t, j, "tenant-a", idem.StatePending)
	waitPast(t, first.CreatedAt)
	recs := []idem.Record{
		createIn(t, j, "tenant-a", idem.StatePending),
		createIn(t, j, "tenant-a", idem.StateInFlight),
		createIn(t, j, "tenant-a", idem.StateSucceeded),
		createIn(t, j, "tenant-a", idem.StateSucceeded),
		createIn(t, j, "tenant-b", idem.StateUnknown),
	}
	last := recs[len(recs)-1]
	waitPast(t, last.CreatedAt)
	recs = append(recs,
		createIn(t, j, "tenant-b", idem.StateUnknown),
		createIn(t, j, "tenant-b", idem.StateExpired),
		createIn(t, j, "tenant-c", idem.StateCanceled),
	)
	// The oldest record moves to in_flight, so it is the oldest there now.
	recs = append(recs, moveTo(t, j, first, idem.StateInFlight))

	type scopeState struct {
		scope string
		state idem.State
	}
	want := map[scopeState]idem.Count{}
	for _, r := range recs {
		g := scopeState{r.Scope, r.State}
		c, ok := want[g]
		if !ok || r.CreatedAt.Before(c.Oldest) {
			c.Oldest = r.CreatedAt
		}
		c.Scope, c.State = r.Scope, r.State
		c.N++
		want[g] = c
	}

	counts, err := j.Count(ctx)
	require.NoError(t, err)
	require.Len(t, counts, len(want), "one Count per (scope, state) with records: %+v", counts)
	for _, c := range counts {
		w, ok := want[scopeState{c.Scope, c.State}]
		if !assert.True(t, ok, "unexpected Count %+v", c) {
			continue
		}
		assert.Equal(t, w.N, c.N, "N of %s/%s", c.Scope, c.State)
		assertTime(t, w.Oldest, c.Oldest, fmt.Sprintf("Oldest of %s/%s", c.Scope, c.State))
	}
}

func testHistory(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	rec := create(t, j, newRecord("tenant-a"))
	evs := history(t, j, rec.Key)
	require.Len(t, evs, 1, "Create adds one event")
	assertEvent(t, idem.Event{Version: 1, At: rec.CreatedAt, Kind: idem.EventCreate, To: idem.StatePending}, evs[0])

	// Acquire records who took the lease; Renew adds nothing.
	held := acquire(t, j, rec.Key, "worker-1", longLease)
	_, err := j.Renew(ctx, map[string]idem.Lease{rec.Key: held.Lease}, longLease)
	require.NoError(t, err)
	evs = history(t, j, rec.Key)
	require.Len(t, evs, 2, "Acquire adds an event, Renew none")
	assertEvent(t, idem.Event{Version: held.Version, At: held.UpdatedAt, Kind: idem.EventClaim,
		From: idem.StatePending, To: idem.StatePending, Owner: "worker-1"}, evs[1])

	next := journal.CloneRecord(held)
	next.State = idem.StateInFlight
	next.Attempts = 1
	sent := update(t, j, next, idem.Durable)

	next = journal.CloneRecord(sent)
	next.State = idem.StateUnknown
	next.LastError = "read: connection reset by peer"
	next.TransportResends = 1
	lost, err := j.Update(ctx, next, idem.Deferred, idem.Event{Kind: idem.EventAnswer, Detail: "sent, then the connection reset"})
	require.NoError(t, err)

	// A worker whose lease lapsed is taken over, and the claim says so.
	require.NoError(t, j.Release(ctx, rec.Key, lost.Lease))
	claimed := claim(t, j, idem.ClaimRequest{Owner: "worker-2", Limit: 1, Lease: longLease})
	require.Len(t, claimed, 1)

	next = journal.CloneRecord(claimed[0])
	next.State = idem.StateUnknown
	next.LastError = "status check: HTTP 502"
	checked, err := j.Update(ctx, next, idem.Buffered, idem.Event{Kind: idem.EventStatus, Detail: "HTTP 502: bad gateway"})
	require.NoError(t, err)

	next = journal.CloneRecord(checked)
	next.State = idem.StateSucceeded
	next.LastError = ""
	next.Response = &idem.Response{StatusCode: http.StatusCreated, Body: []byte(`{"id":7}`), Replayed: true}
	done := update(t, j, next, idem.Deferred)

	evs = history(t, j, rec.Key)
	require.Len(t, evs, 7, "one event per Create, Acquire, Claim and Update")
	assertEvent(t, idem.Event{Version: sent.Version, At: sent.UpdatedAt, From: idem.StatePending, To: idem.StateInFlight, Attempt: 1, Owner: "worker-1"}, evs[2])
	assertEvent(t, idem.Event{Version: lost.Version, At: lost.UpdatedAt, Kind: idem.EventAnswer, Detail: "sent, then the connection reset",
		From: idem.StateInFlight, To: idem.StateUnknown, Attempt: 1, Error: "read: connection reset by peer", Owner: "worker-1"}, evs[3])
	assertEvent(t, idem.Event{Version: claimed[0].Version, At: claimed[0].UpdatedAt, Kind: idem.EventClaim,
		From: idem.StateUnknown, To: idem.StateUnknown, Attempt: 1, Error: "read: connection reset by peer", Owner: "worker-2"}, evs[4])
	assert.Empty(t, evs[4].Detail, "a released lease is free: nothing was taken over")
	assertEvent(t, idem.Event{Version: checked.Version, At: checked.UpdatedAt, Kind: idem.EventStatus, Detail: "HTTP 502: bad gateway",
		From: idem.StateUnknown, To: idem.StateUnknown, Attempt: 1, Error: "status check: HTTP 502", Owner: "worker-2"}, evs[5])
	assertEvent(t, idem.Event{Version: done.Version, At: done.UpdatedAt, From: idem.StateUnknown, To: idem.StateSucceeded, Attempt: 1, StatusCode: http.StatusCreated, Owner: "worker-2"}, evs[6])
	for i, ev := range evs {
		assert.Equal(t, int64(i+1), ev.Version, "the history has no gap: every version has its event")
	}
	assert.Equal(t, 1, get(t, j, rec.Key).TransportResends)

	// A refused update adds no event.
	next = journal.CloneRecord(done)
	next.State = idem.StateRejected
	_, err = j.Update(ctx, next, idem.Durable, idem.Event{})
	require.ErrorIs(t, err, idem.ErrIllegalTransition)
	assert.Len(t, history(t, j, rec.Key), 7, "no event for a refused update")
}

func testHistoryTakeover(t *testing.T, j idem.Journal) {
	rec := create(t, j, newRecord("tenant-a"))
	lapsed := acquire(t, j, rec.Key, "worker-1", shortLease)
	waitExpired(t, lapsed.Lease)
	taken := acquire(t, j, rec.Key, "worker-2", longLease)
	evs := history(t, j, rec.Key)
	require.Len(t, evs, 3)
	assert.Equal(t, idem.EventClaim, evs[2].Kind)
	assert.Equal(t, "worker-2", evs[2].Owner)
	assert.Equal(t, taken.Version, evs[2].Version)
	assert.Contains(t, evs[2].Detail, "worker-1", "the takeover names the previous holder")
	assert.Contains(t, evs[2].Detail, "lapsed", "and why its lease could be taken")
}

func testHistoryNote(t *testing.T, j idem.Journal) {
	rec := create(t, j, newRecord("tenant-a"))
	next := journal.CloneRecord(rec)
	next.State = idem.StateExpired
	next.LastError = "key retention passed before the outcome was confirmed"
	expired := update(t, j, next, idem.Durable)

	next = journal.CloneRecord(expired)
	next.State = idem.StateSucceeded
	next.Note = "matched order 9812 in ERP"
	settled := update(t, j, next, idem.Durable)

	evs := history(t, j, rec.Key)
	require.Len(t, evs, 3)
	assertEvent(t, idem.Event{Version: expired.Version, At: expired.UpdatedAt, From: idem.StatePending, To: idem.StateExpired, Error: "key retention passed before the outcome was confirmed"}, evs[1])
	assertEvent(t, idem.Event{Version: settled.Version, At: settled.UpdatedAt, From: idem.StateExpired, To: idem.StateSucceeded, Error: "matched order 9812 in ERP"}, evs[2])
}

func testHistoryNotFound(t *testing.T, j idem.Journal) {
	rec := create(t, j, newRecord("tenant-a"))
	_, err := j.History(t.Context(), uuid.NewString())
	require.ErrorIs(t, err, idem.ErrNotFound)
	_, err = j.History(t.Context(), rec.ID)
	require.ErrorIs(t, err, idem.ErrNotFound, "History by operation ID is not History by key")
}

func assertEvent(t *testing.T, want, got idem.Event) {
	t.Helper()
	assert.Equal(t, want.Version, got.Version, "Event.Version")
	assertTime(t, want.At, got.At, "Event.At")
	assert.Equal(t, want.Kind, got.Kind, "Event.Kind")
	assert.Equal(t, want.Detail, got.Detail, "Event.Detail")
	assert.Equal(t, want.From, got.From, "Event.From")
	assert.Equal(t, want.To, got.To, "Event.To")
	assert.Equal(t, want.Attempt, got.Attempt, "Event.Attempt")
	assert.Equal(t, want.StatusCode, got.StatusCode, "Event.StatusCode")
	assert.Equal(t, want.Error, got.Error, "Event.Error")
	assert.Equal(t, want.Owner, got.Owner, "Event.Owner")
}

func testPrune(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	var old, kept []idem.Record
	for _, s := range []idem.State{idem.StateSucceeded, idem.StateRejected, idem.StateCanceled} {
		old = append(old, createIn(t, j, "tenant-a", s))
	}
	for _, s := range []idem.State{idem.StateExpired, idem.StatePending, idem.StateInFlight, idem.StateUnknown} {
		kept = append(kept, createIn(t, j, "tenant-a", s))
	}
	leased := create(t, j, newRecord("tenant-a"))
	kept = append(kept, acquire(t, j, leased.Key, "worker-1", longLease))
	cut := old[0].UpdatedAt
	for _, r := range append(old, kept...) {
		if r.UpdatedAt.After(cut) {
			cut = r.UpdatedAt
		}
	}
	oldest := old[0].UpdatedAt
	for _, r := range old {
		if r.UpdatedAt.Before(oldest) {
			oldest = r.UpdatedAt
		}
	}
	cut = cut.Add(time.Millisecond)
	waitPast(t, cut)
	recent := createIn(t, j, "tenant-a", idem.StateSucceeded)
	kept = append(kept, recent)
	require.False(t, recent.UpdatedAt.Before(cut), "test setup: %v is before %v", recent.UpdatedAt, cut)

	n, err := j.Prune(ctx, oldest)
	require.NoError(t, err)
	assert.Zero(t, n, "Prune deletes records updated strictly before the cut-off")

	n, err = j.Prune(ctx, cut)
	require.NoError(t, err)
	assert.Equal(t, len(old), n, "Prune reports what it deleted")
	for _, r := range old {
		requireGone(t, j, r)
		_, err := j.History(ctx, r.Key)
		require.ErrorIs(t, err, idem.ErrNotFound, "the history of a pruned %s record", r.State)
	}
	for _, r := range kept {
		requireStored(t, j, r)
		assert.NotEmpty(t, history(t, j, r.Key), "history of a kept %s record", r.State)
	}
	assert.Equal(t, keysOf(kept...), listKeys(t, j, idem.Filter{}), "List after Prune")
	counts, err := j.Count(ctx)
	require.NoError(t, err)
	total := 0
	for _, c := range counts {
		total += c.N
	}
	assert.Equal(t, len(kept), total, "Count after Prune")

	n, err = j.Prune(ctx, cut)
	require.NoError(t, err)
	assert.Zero(t, n, "a second Prune finds nothing")

	// A pruned operation ID is free again.
	again := newRecord("tenant-a")
	again.ID = old[0].ID
	create(t, j, again)
}

func testClose(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	rec := create(t, j, newRecord("tenant-a"))
	require.NoError(t, j.Close())

	closed := func(what string, err error) {
		t.Helper()
		assert.ErrorIs(t, err, idem.ErrJournalClosed, "%s after Close", what)
	}
	_, _, err := j.Create(ctx, newRecord("tenant-a"))
	closed("Create", err)
	_, err = j.Get(ctx, rec.Key)
	closed("Get", err)
	_, err = j.Lookup(ctx, rec.Scope, rec.ID)
	closed("Lookup", err)
	next := journal.CloneRecord(rec)
	next.State = idem.StateInFlight
	_, err = j.Update(ctx, next, idem.Durable, idem.Event{})
	closed("Update", err)
	_, err = j.Update(ctx, next, idem.Deferred, idem.Event{})
	closed("deferred Update", err)
	_, err = j.Claim(ctx, idem.ClaimRequest{Owner: "worker-1", Limit: 1, Lease: longLease})
	closed("Claim", err)
	_, err = j.Acquire(ctx, rec.Key, "worker-1", longLease)
	closed("Acquire", err)
	_, err = j.Renew(ctx, map[string]idem.Lease{rec.Key: {Owner: "worker-1", Epoch: 1}}, longLease)
	closed("Renew", err)
	_, err = j.Register(ctx, "worker-9")
	closed("Register", err)
	closed("Sync", j.Sync(ctx))
	closed("Release", j.Release(ctx, rec.Key, idem.Lease{Owner: "worker-1", Epoch: 1}))
	var listErr error
	yielded := 0
	for _, err := range j.List(ctx, idem.Filter{}) {
		yielded++
		if err != nil {
			listErr = err
			break
		}
	}
	closed("List", listErr)
	assert.Equal(t, 1, yielded, "List after Close yields only the error")
	_, err = j.Count(ctx)
	closed("Count", err)
	_, err = j.History(ctx, rec.Key)
	closed("History", err)
	_, err = j.Prune(ctx, time.Now().Add(time.Hour))
	closed("Prune", err)

	if err := j.Close(); err != nil {
		assert.ErrorIs(t, err, idem.ErrJournalClosed, "a second Close")
	}
}

func testContextCanceled(t *testing.T, j idem.Journal) {
	rec := create(t, j, newRecord("tenant-a"))
	fresh := newRecord("tenant-a")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()

	call := func(what string, fn func() error) {
		t.Helper()
		var err error
		within(t, what+" with a canceled context", func() { err = fn() })
		assert.ErrorIs(t, err, context.Canceled, "%s with a canceled context", what)
	}
	call("Create", func() error { _, _, err := j.Create(ctx, fresh); return err })
	call("Get", func() error { _, err := j.Get(ctx, rec.Key); return err })
	call("Lookup", func() error { _, err := j.Lookup(ctx, rec.Scope, rec.ID); return err })
	next := journal.CloneRecord(rec)
	next.State = idem.StateInFlight
	call("Update", func() error { _, err := j.Update(ctx, next, idem.Durable, idem.Event{}); return err })
	call("deferred Update", func() error { _, err := j.Update(ctx, next, idem.Deferred, idem.Event{}); return err })
	call("Claim", func() error {
		_, err := j.Claim(ctx, idem.ClaimRequest{Owner: "worker-1", Limit: 1, Lease: longLease})
		return err
	})
	call("Acquire", func() error { _, err := j.Acquire(ctx, rec.Key, "worker-1", longLease); return err })
	call("Renew", func() error {
		_, err := j.Renew(ctx, map[string]idem.Lease{rec.Key: {Owner: "worker-1", Epoch: 1}}, longLease)
		return err
	})
	call("Register", func() error { _, err := j.Register(ctx, "worker-9"); return err })
	call("Sync", func() error { return j.Sync(ctx) })
	call("Release", func() error { return j.Release(ctx, rec.Key, idem.Lease{Owner: "worker-1", Epoch: 1}) })
	call("Count", func() error { _, err := j.Count(ctx); return err })
	call("History", func() error { _, err := j.History(ctx, rec.Key); return err })
	call("Prune", func() error { _, err := j.Prune(ctx, time.Now().Add(time.Hour)); return err })
	yielded := 0
	call("List", func() error {
		for _, err := range j.List(ctx, idem.Filter{}) {
			yielded++
			if err != nil {
				return err
			}
		}
		return nil
	})
	assert.Equal(t, 1, yielded, "List with a canceled context yields only the error")

	// Nothing changed.
	requireGone(t, j, fresh)
	requireStored(t, j, rec)
	assert.Len(t, history(t, j, rec.Key), 1)
}
