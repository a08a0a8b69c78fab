package journaltest

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/journal"
)

// createDue creates a pending record in scope due at next (zero: due now).
func createDue(t *testing.T, j idem.Journal, scope string, next time.Time) idem.Record {
	t.Helper()
	rec := newRecord(scope)
	rec.NextAttemptAt = next
	return create(t, j, rec)
}

// claim claims for owner, which must succeed.
func claim(t *testing.T, j idem.Journal, req idem.ClaimRequest) []idem.Record {
	t.Helper()
	recs, err := j.Claim(t.Context(), req)
	require.NoError(t, err, "Claim %+v", req)
	return recs
}

func acquire(t *testing.T, j idem.Journal, key, owner string, lease time.Duration) idem.Record {
	t.Helper()
	rec, err := j.Acquire(t.Context(), key, owner, lease)
	require.NoError(t, err, "Acquire %s for %s", key, owner)
	return rec
}

// assertLeased checks that got is before, leased to owner at the next epoch
// for lease, granted between from and to.
func assertLeased(t *testing.T, before, got idem.Record, owner string, lease time.Duration, from, to time.Time) {
	t.Helper()
	assert.Equal(t, before.Key, got.Key, "Key")
	assert.Equal(t, owner, got.Lease.Owner, "Lease.Owner")
	assert.Equal(t, before.Lease.Epoch+1, got.Lease.Epoch, "Lease.Epoch")
	assertBetween(t, got.Lease.ExpiresAt, from.Add(lease), to.Add(lease), "Lease.ExpiresAt")
	assert.Equal(t, before.Version+1, got.Version, "Version")
	assert.Equal(t, before.State, got.State, "State")
	assert.Equal(t, before.Attempts, got.Attempts, "Attempts")
	assertTime(t, before.NextAttemptAt, got.NextAttemptAt, "NextAttemptAt")
	assertRequest(t, before, got)
}

func testClaimSelection(t *testing.T, j idem.Journal) {
	now := time.Now()
	past := func(d time.Duration) time.Time { return now.Add(-d) }

	// Due, claimable records, listed oldest due first.
	dueZero := createDue(t, j, "tenant-a", time.Time{})
	duePending := createDue(t, j, "tenant-a", past(3*time.Second))
	inFlight := newRecord("tenant-b")
	inFlight.State = idem.StateInFlight
	inFlight.NextAttemptAt = past(2 * time.Second)
	dueInFlight := create(t, j, inFlight)
	unknown := createDue(t, j, "tenant-a", past(time.Second))
	next := journal.CloneRecord(unknown)
	next.State = idem.StateUnknown
	dueUnknown := update(t, j, next, idem.Durable)
	want := []idem.Record{dueZero, duePending, dueInFlight, dueUnknown}

	// Records Claim must skip.
	skip := map[string]string{}
	notDue := createDue(t, j, "tenant-a", now.Add(time.Hour))
	skip[notDue.Key] = "not due"
	for _, s := range []idem.State{idem.StateSucceeded, idem.StateRejected, idem.StateCanceled, idem.StateExpired} {
		rec := createDue(t, j, "tenant-a", past(time.Hour))
		rec = moveTo(t, j, rec, s)
		skip[rec.Key] = s.String()
	}
	leased := createDue(t, j, "tenant-a", past(time.Hour))
	leasedBy := acquire(t, j, leased.Key, "worker-other", longLease)
	skip[leased.Key] = "leased"
	createdLeased := newRecord("tenant-a")
	createdLeased.State = idem.StateInFlight
	createdLeased.Lease = idem.Lease{Owner: "worker-other", ExpiresAt: now.Add(longLease)}
	createdLeased = create(t, j, createdLeased)
	skip[createdLeased.Key] = "created leased"

	before := time.Now()
	got := claim(t, j, idem.ClaimRequest{Owner: "worker-1", Limit: 100, Lease: longLease})
	after := time.Now()
	require.Equal(t, keysOf(want...), keysOf(got...), "Claim takes the active, due, free records, oldest due first")
	for i, rec := range got {
		assertLeased(t, want[i], rec, "worker-1", longLease, before, after)
		requireStored(t, j, rec)
	}
	for key, why := range skip {
		assert.NotEqual(t, "worker-1", get(t, j, key).Lease.Owner, "a %s record was claimed", why)
	}
	assertLease(t, leasedBy.Lease, get(t, j, leased.Key).Lease, "the other worker's lease")

	// Nothing is claimed twice while the leases are live, by anyone.
	for _, owner := range []string{"worker-2", "worker-1", "worker-other"} {
		assert.Empty(t, claim(t, j, idem.ClaimRequest{Owner: owner, Limit: 100, Lease: longLease}), "second Claim by %s", owner)
	}
	for _, rec := range got {
		requireStored(t, j, rec)
	}
}

func testClaimLimitOrder(t *testing.T, j idem.Journal) {
	now := time.Now()
	// Created in an order unrelated to when they are due.
	offsets := []time.Duration{3, 1, 5, 2, 4}
	byDue := make([]idem.Record, len(offsets))
	for _, o := range offsets {
		byDue[len(offsets)-int(o)] = createDue(t, j, "tenant-a", now.Add(-o*time.Second))
	}
	req := idem.ClaimRequest{Owner: "worker-1", Limit: 2, Lease: longLease}
	assert.Equal(t, keysOf(byDue[0:2]...), keysOf(claim(t, j, req)...), "first two due")
	assert.Equal(t, keysOf(byDue[2:4]...), keysOf(claim(t, j, req)...), "next two due")
	assert.Equal(t, keysOf(byDue[4:]...), keysOf(claim(t, j, req)...), "the last one")
	assert.Empty(t, claim(t, j, req), "nothing left")

	one := createDue(t, j, "tenant-a", time.Time{})
	got := claim(t, j, idem.ClaimRequest{Owner: "worker-2", Limit: 1, Lease: longLease})
	assert.Equal(t, []string{one.Key}, keysOf(got...), "Limit 1")
}

func testClaimScope(t *testing.T, j idem.Journal) {
	var a, b []idem.Record
	for range 3 {
		a = append(a, createDue(t, j, "tenant-a", time.Time{}))
		b = append(b, createDue(t, j, "tenant-b", time.Time{}))
	}
	got := claim(t, j, idem.ClaimRequest{Owner: "worker-1", Limit: 10, Lease: longLease, Scope: "tenant-a"})
	assert.ElementsMatch(t, keysOf(a...), keysOf(got...), "Claim in tenant-a")
	for _, rec := range b {
		assert.Empty(t, get(t, j, rec.Key).Lease.Owner, "a tenant-b record was claimed")
	}
	assert.Empty(t, claim(t, j, idem.ClaimRequest{Owner: "worker-1", Limit: 10, Lease: longLease, Scope: "tenant-c"}), "Claim in an empty scope")
	got = claim(t, j, idem.ClaimRequest{Owner: "worker-2", Limit: 10, Lease: longLease})
	assert.ElementsMatch(t, keysOf(b...), keysOf(got...), "Claim in every scope")
}

func testClaimDueBy(t *testing.T, j idem.Journal) {
	sweep := time.Now().Add(-time.Minute)
	before := createDue(t, j, "tenant-a", sweep.Add(-time.Minute))
	after := createDue(t, j, "tenant-a", sweep.Add(30*time.Second)) // due now, but not by the sweep's start
	got := claim(t, j, idem.ClaimRequest{Owner: "worker-1", Limit: 10, Lease: longLease, DueBy: sweep})
	assert.ElementsMatch(t, keysOf(before), keysOf(got...), "only records due by DueBy")
	assert.Empty(t, get(t, j, after.Key).Lease.Owner)
	got = claim(t, j, idem.ClaimRequest{Owner: "worker-1", Limit: 10, Lease: longLease, DueBy: time.Now().Add(time.Hour)})
	assert.ElementsMatch(t, keysOf(after), keysOf(got...), "a DueBy in the future means now")
}

func testClaimURLPrefix(t *testing.T, j idem.Journal) {
	ours := createDue(t, j, "tenant-a", time.Time{}) // https://api.example.test/v1/orders
	other := newRecord("tenant-a")
	other.URL = "https://payments.example.test/v1/charges"
	other = create(t, j, other)
	lookalike := newRecord("tenant-a")
	lookalike.URL = "https://api.example.test.evil.example/v1/orders"
	lookalike = create(t, j, lookalike)

	got := claim(t, j, idem.ClaimRequest{Owner: "worker-1", Limit: 10, Lease: longLease, URLPrefix: "https://api.example.test/"})
	assert.ElementsMatch(t, keysOf(ours), keysOf(got...), "only records under the prefix are claimed")
	assert.Empty(t, get(t, j, other.Key).Lease.Owner)
	assert.Empty(t, get(t, j, lookalike.Key).Lease.Owner, "a prefix match is exact, byte for byte")
	assert.Empty(t, claim(t, j, idem.ClaimRequest{Owner: "worker-1", Limit: 10, Lease: longLease, URLPrefix: "https://api.example.test/v2/"}))
}

func testClaimInvalid(t *testing.T, j idem.Journal) {
	rec := createDue(t, j, "tenant-a", time.Time{})
	for _, req := range []idem.ClaimRequest{
		{Owner: "", Limit: 1, Lease: longLease},
		{Owner: "worker-1", Limit: 0, Lease: longLease},
		{Owner: "worker-1", Limit: -1, Lease: longLease},
		{Owner: "worker-1", Limit: 1, Lease: 0},
		{Owner: "worker-1", Limit: 1, Lease: -time.Second},
	} {
		got, err := j.Claim(t.Context(), req)
		require.Error(t, err, "Claim %+v", req)
		assert.Empty(t, got, "Claim %+v", req)
		requireStored(t, j, rec)
	}
}

func testClaimAfterExpiry(t *testing.T, j idem.Journal) {
	rec := createDue(t, j, "tenant-a", time.Time{})
	first := claim(t, j, idem.ClaimRequest{Owner: "worker-1", Limit: 1, Lease: shortLease})
	require.Len(t, first, 1)
	assert.Equal(t, int64(1), first[0].Lease.Epoch)

	var second []idem.Record
	var lastErr error
	require.Eventually(t, func() bool {
		second, lastErr = j.Claim(t.Context(), idem.ClaimRequest{Owner: "worker-2", Limit: 10, Lease: longLease})
		return lastErr == nil && len(second) > 0
	}, waitFor, pollEvery, "the expired lease was never claimed again (last error: %v)", lastErr)
	require.Equal(t, []string{rec.Key}, keysOf(second...))
	assert.Equal(t, "worker-2", second[0].Lease.Owner)
	assert.Equal(t, int64(2), second[0].Lease.Epoch, "the takeover increments the epoch")
	assert.Equal(t, first[0].Version+1, second[0].Version)
	requireStored(t, j, second[0])
}

func testAcquire(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	rec := createDue(t, j, "tenant-a", time.Now().Add(time.Hour))

	before := time.Now()
	held, err := j.Acquire(ctx, rec.Key, "worker-1", longLease)
	after := time.Now()
	require.NoError(t, err, "Acquire ignores NextAttemptAt")
	assertLeased(t, rec, held, "worker-1", longLease, before, after)
	requireStored(t, j, held)

	cur, err := j.Acquire(ctx, rec.Key, "worker-2", longLease)
	require.ErrorIs(t, err, idem.ErrLeased)
	assert.Equal(t, rec.Key, cur.Key, "ErrLeased comes with the current record")
	assertLease(t, held.Lease, cur.Lease, "Lease of the record returned with ErrLeased")
	assert.Equal(t, held.Version, cur.Version)
	requireStored(t, j, held)

	for _, s := range []idem.State{idem.StateSucceeded, idem.StateRejected, idem.StateCanceled, idem.StateExpired} {
		done := createIn(t, j, "tenant-a", s)
		cur, err := j.Acquire(ctx, done.Key, "worker-1", longLease)
		require.ErrorIs(t, err, idem.ErrNotActive, "Acquire of a %s record", s)
		assert.Equal(t, done.Key, cur.Key, "ErrNotActive comes with the current record")
		assert.Equal(t, s, cur.State, "ErrNotActive comes with the current record")
		requireStored(t, j, done)
	}

	_, err = j.Acquire(ctx, uuid.NewString(), "worker-1", longLease)
	require.ErrorIs(t, err, idem.ErrNotFound)

	free := create(t, j, newRecord("tenant-a"))
	_, err = j.Acquire(ctx, free.Key, "", longLease)
	require.Error(t, err, "Acquire without an owner")
	_, err = j.Acquire(ctx, free.Key, "worker-1", 0)
	require.Error(t, err, "Acquire for no time")
	requireStored(t, j, free)
}

func testHolderUpdate(t *testing.T, j idem.Journal) {
	for _, how := range []string{"Acquire", "Claim", "Create"} {
		t.Run(how, func(t *testing.T) {
			var held idem.Record
			switch how {
			case "Acquire":
				rec := create(t, j, newRecord("tenant-"+how))
				held = acquire(t, j, rec.Key, "worker-1", longLease)
			case "Claim":
				create(t, j, newRecord("tenant-"+how))
				recs := claim(t, j, idem.ClaimRequest{Owner: "worker-1", Limit: 1, Lease: longLease, Scope: "tenant-" + how})
				require.Len(t, recs, 1)
				held = recs[0]
			case "Create":
				rec := newRecord("tenant-" + how)
				rec.State = idem.StateInFlight
				rec.Lease = idem.Lease{Owner: "worker-1", ExpiresAt: time.Now().Add(longLease)}
				held = create(t, j, rec)
			}
			next := journal.CloneRecord(held)
			next.State = idem.StateInFlight
			next.Attempts = 1
			got := update(t, j, next, idem.Durable)
			assert.Equal(t, held.Version+1, got.Version)
			assertLease(t, held.Lease, got.Lease, "the holder keeps its lease")
			requireStored(t, j, got)

			next = journal.CloneRecord(got)
			next.State = idem.StateUnknown
			next.LastError = "read: connection reset by peer"
			got = update(t, j, next, idem.Deferred)
			assert.Equal(t, idem.StateUnknown, got.State)
			requireStored(t, j, got)
		})
	}
}

func testHolderSetsExpiry(t *testing.T, j idem.Journal) {
	rec := create(t, j, newRecord("tenant-a"))
	held := acquire(t, j, rec.Key, "worker-1", longLease)

	// A zero Lease.ExpiresAt keeps the stored expiry.
	next := journal.CloneRecord(held)
	next.State = idem.StateInFlight
	next.Lease.ExpiresAt = time.Time{}
	got := update(t, j, next, idem.Durable)
	assertLease(t, held.Lease, got.Lease, "Lease after an update with no expiry")

	// The holder may move its expiry.
	until := time.Now().Add(2 * longLease)
	next = journal.CloneRecord(got)
	next.Lease.ExpiresAt = until
	got = update(t, j, next, idem.Durable)
	assertLease(t, idem.Lease{Owner: "worker-1", Epoch: held.Lease.Epoch, ExpiresAt: until}, got.Lease, "Lease after the holder moved its expiry")
	requireStored(t, j, got)
}

func testUnleasedWrite(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	rec := create(t, j, newRecord("tenant-a"))
	held := acquire(t, j, rec.Key, "worker-1", longLease)

	// A writer without a lease, or with a lease it does not hold, is
	// refused while the lease is live.
	next := journal.CloneRecord(held)
	next.Lease = idem.Lease{}
	next.State = idem.StateCanceled
	_, err := j.Update(ctx, next, idem.Durable, idem.Event{})
	require.ErrorIs(t, err, idem.ErrLeased, "an update without a lease while another's is live")
	requireStored(t, j, held)
	next.Lease = idem.Lease{Owner: "worker-2", Epoch: held.Lease.Epoch, ExpiresAt: held.Lease.ExpiresAt}
	_, err = j.Update(ctx, next, idem.Durable, idem.Event{})
	require.ErrorIs(t, err, idem.ErrLeaseLost, "an update under a lease the writer does not hold")
	requireStored(t, j, held)

	// Once a lease has run out, an unleased writer (Cancel, Reconcile) may
	// write.
	rec = create(t, j, newRecord("tenant-a"))
	held = acquire(t, j, rec.Key, "worker-1", shortLease)
	waitExpired(t, held.Lease)
	next = journal.CloneRecord(held)
	next.Lease = idem.Lease{}
	next.State = idem.StateCanceled
	got := update(t, j, next, idem.Durable)
	assert.Equal(t, idem.StateCanceled, got.State)
	assert.Empty(t, got.Lease.Owner)
	requireStored(t, j, got)
}

func testFencing(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	for _, how := range []string{"Claim", "Acquire", "SameOwnerAgain"} {
		t.Run(how, func(t *testing.T) {
			rec := createDue(t, j, "tenant-"+how, time.Time{})
			a := acquire(t, j, rec.Key, "worker-A", shortLease)
			owner := "worker-B"
			if how == "SameOwnerAgain" {
				owner = "worker-A" // a restarted worker with the same name
			}

			var b idem.Record
			var lastErr error
			require.Eventually(t, func() bool {
				if how == "Claim" {
					var recs []idem.Record
					recs, lastErr = j.Claim(ctx, idem.ClaimRequest{Owner: owner, Limit: 1, Lease: longLease, Scope: rec.Scope})
					if lastErr == nil && len(recs) == 1 {
						b = recs[0]
						return true
					}
					return false
				}
				b, lastErr = j.Acquire(ctx, rec.Key, owner, longLease)
				return lastErr == nil
			}, waitFor, pollEvery, "the expired lease was never taken over (last error: %v)", lastErr)
			require.Equal(t, owner, b.Lease.Owner)
			require.Equal(t, a.Lease.Epoch+1, b.Lease.Epoch, "the takeover increments the epoch")

			// The old holder's write, as it had the record.
			stale := journal.CloneRecord(a)
			stale.State = idem.StateInFlight
			stale.Attempts = 1
			_, err := j.Update(ctx, stale, idem.Durable, idem.Event{})
			require.ErrorIs(t, err, idem.ErrLeaseLost, "write under the old lease")
			requireStored(t, j, b)

			// Re-reading gives it the fresh version, not the lease.
			fresh := get(t, j, rec.Key)
			fresh.Lease = a.Lease
			fresh.State = idem.StateInFlight
			fresh.Attempts = 1
			_, err = j.Update(ctx, fresh, idem.Durable, idem.Event{})
			require.ErrorIs(t, err, idem.ErrLeaseLost, "write at the fresh version under the old lease")
			fresh.State = idem.StateSucceeded
			_, err = j.Update(ctx, fresh, idem.Deferred, idem.Event{})
			require.ErrorIs(t, err, idem.ErrLeaseLost, "deferred write at the fresh version under the old lease")
			require.ErrorIs(t, j.Release(ctx, rec.Key, a.Lease), idem.ErrLeaseLost, "release of the old lease")
			requireStored(t, j, b)

			// The new holder writes.
			next := journal.CloneRecord(b)
			next.State = idem.StateInFlight
			next.Attempts = 1
			got := update(t, j, next, idem.Durable)
			assertLease(t, b.Lease, got.Lease, "the new holder's lease")
		})
	}
}

func testRenew(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	r1 := create(t, j, newRecord("tenant-a"))
	r2 := create(t, j, newRecord("tenant-a"))
	r3 := create(t, j, newRecord("tenant-b"))
	r4 := create(t, j, newRecord("tenant-a"))

	lapsed := acquire(t, j, r1.Key, "worker-A", shortLease)
	waitExpired(t, lapsed.Lease)
	a2 := acquire(t, j, r2.Key, "worker-A", longLease)
	a3 := acquire(t, j, r3.Key, "worker-A", longLease)
	b4 := acquire(t, j, r4.Key, "worker-B", longLease)

	before := time.Now()
	n, err := j.Renew(ctx, map[string]idem.Lease{a2.Key: a2.Lease, a3.Key: a3.Lease}, time.Hour)
	after := time.Now()
	require.NoError(t, err)
	assert.Equal(t, 2, n, "Renew extends the leases it is given")
	for _, held := range []idem.Record{a2, a3} {
		got := get(t, j, held.Key)
		assert.Equal(t, "worker-A", got.Lease.Owner)
		assert.Equal(t, held.Lease.Epoch, got.Lease.Epoch, "Renew keeps the epoch")
		assertBetween(t, got.Lease.ExpiresAt, before.Add(time.Hour), after.Add(time.Hour), "renewed Lease.ExpiresAt")
		assert.Equal(t, held.Version, got.Version, "Renew does not change the version")
	}
	requireStored(t, j, lapsed)
	requireStored(t, j, b4)

	// A lease that is not the record's (another owner's, or another epoch)
	// and a key that does not exist renew nothing.
	n, err = j.Renew(ctx, map[string]idem.Lease{
		b4.Key:        {Owner: "worker-A", Epoch: b4.Lease.Epoch},
		a2.Key:        {Owner: "worker-A", Epoch: a2.Lease.Epoch + 1},
		"no-such-key": {Owner: "worker-A", Epoch: 1},
	}, 2*time.Hour)
	require.NoError(t, err)
	assert.Zero(t, n)
	requireStored(t, j, b4)
	n, err = j.Renew(ctx, nil, time.Hour)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing to renew")

	// The holder's next update, at the version and with the lease it had
	// before Renew.
	next := journal.CloneRecord(a2)
	next.State = idem.StateInFlight
	next.Attempts = 1
	got := update(t, j, next, idem.Durable)
	assert.Equal(t, a2.Version+1, got.Version)
	assert.Equal(t, "worker-A", got.Lease.Owner)
	assert.Equal(t, a2.Lease.Epoch, got.Lease.Epoch)
	assertBetween(t, got.Lease.ExpiresAt, before.Add(time.Hour), after.Add(time.Hour),
		"an update carrying the lease from before Renew must not shorten the renewed lease")
	assert.Len(t, history(t, j, r3.Key), 2, "Renew adds no event")

	// The lapsed lease was not revived: another worker takes the record.
	taken := acquire(t, j, r1.Key, "worker-B", longLease)
	assert.Equal(t, lapsed.Lease.Epoch+1, taken.Lease.Epoch)
}

// testRenewByEpoch: a process restarted under the name of one that died
// never renews the dead one's leases, so they lapse and are taken.
func testRenewByEpoch(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	dead := acquire(t, j, create(t, j, newRecord("tenant-a")).Key, "pod-1", shortLease)
	mine := acquire(t, j, create(t, j, newRecord("tenant-a")).Key, "pod-1", longLease)
	waitExpired(t, dead.Lease)
	n, err := j.Renew(ctx, map[string]idem.Lease{mine.Key: mine.Lease}, longLease)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	requireStored(t, j, dead)
	taken := acquire(t, j, dead.Key, "pod-1", longLease)
	assert.Equal(t, dead.Lease.Epoch+1, taken.Lease.Epoch, "the new holder is told apart by epoch")
}

// testGoneOwner: the live lease of an owner that registered and is gone is
// taken at once, by Claim and by Acquire, and the claim says why; the live
// lease of a registered owner, or of one that never registered, is not.
func testGoneOwner(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	unregister, err := j.Register(ctx, "worker-gone")
	require.NoError(t, err)
	alive, err := j.Register(ctx, "worker-alive")
	require.NoError(t, err)
	defer alive()

	byGone := []idem.Record{
		acquire(t, j, createDue(t, j, "tenant-a", time.Time{}).Key, "worker-gone", longLease),
		acquire(t, j, createDue(t, j, "tenant-a", time.Time{}).Key, "worker-gone", longLease),
	}
	byAlive := acquire(t, j, createDue(t, j, "tenant-a", time.Time{}).Key, "worker-alive", longLease)
	byUnknown := acquire(t, j, createDue(t, j, "tenant-a", time.Time{}).Key, "worker-never-registered", longLease)

	got := claim(t, j, idem.ClaimRequest{Owner: "worker-new", Limit: 10, Lease: longLease})
	assert.Empty(t, got, "every lease is live and its owner is not known to be gone")
	_, err = j.Acquire(ctx, byGone[0].Key, "worker-new", longLease)
	require.ErrorIs(t, err, idem.ErrLeased)

	require.NoError(t, unregister())
	got = claim(t, j, idem.ClaimRequest{Owner: "worker-new", Limit: 1, Lease: longLease})
	require.Len(t, got, 1, "Claim takes a gone owner's lease at once")
	var other idem.Record
	switch got[0].Key {
	case byGone[0].Key:
		other = byGone[1]
	case byGone[1].Key:
		other = byGone[0]
	default:
		t.Fatalf("Claim took %s, which is not leased by the gone owner", got[0].Key)
	}
	assert.Equal(t, "worker-new", got[0].Lease.Owner)
	taken := acquire(t, j, other.Key, "worker-new", longLease)
	assert.Equal(t, other.Lease.Epoch+1, taken.Lease.Epoch, "Acquire takes it too, with a new epoch")

	evs := history(t, j, taken.Key)
	last := evs[len(evs)-1]
	assert.Equal(t, idem.EventClaim, last.Kind)
	assert.Contains(t, last.Detail, "worker-gone", "the takeover names the previous holder")
	assert.Contains(t, last.Detail, "gone", "and says its owner is gone")

	// The fenced holder's write is refused.
	next := journal.CloneRecord(other)
	next.State = idem.StateInFlight
	next.Attempts = 1
	_, err = j.Update(ctx, next, idem.Durable, idem.Event{})
	require.ErrorIs(t, err, idem.ErrLeaseLost)

	// An operator's write (no lease) goes over a gone owner's lease too.
	byGone2 := acquire(t, j, createDue(t, j, "tenant-a", time.Time{}).Key, "worker-gone-2", longLease)
	unregister2, err := j.Register(ctx, "worker-gone-2")
	require.NoError(t, err)
	next = journal.CloneRecord(byGone2)
	next.Lease = idem.Lease{}
	next.State = idem.StateCanceled
	_, err = j.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventOperator})
	require.ErrorIs(t, err, idem.ErrLeased, "not while its owner lives")
	require.NoError(t, unregister2())
	canceled, err := j.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventOperator})
	require.NoError(t, err, "an operator's write goes over a gone owner's lease")
	assert.Equal(t, idem.StateCanceled, canceled.State)

	requireStored(t, j, byAlive)
	requireStored(t, j, byUnknown)
	_, err = j.Acquire(ctx, byAlive.Key, "worker-new", longLease)
	require.ErrorIs(t, err, idem.ErrLeased, "a live owner's lease is never taken")
}

func testRegister(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	_, err := j.Register(ctx, "")
	require.ErrorIs(t, err, idem.ErrInvalidRecord, "an owner needs a name")
	unregister, err := j.Register(ctx, "worker-1")
	require.NoError(t, err)
	_, err = j.Register(ctx, "worker-1")
	require.ErrorIs(t, err, idem.ErrInvalidRecord, "a name is registered once")
	require.NoError(t, unregister())
	require.NoError(t, unregister(), "unregistering twice is harmless")
	_, err = j.Register(ctx, "worker-1")
	require.ErrorIs(t, err, idem.ErrInvalidRecord, "a name is never registered again, even after it left")
}

func testRelease(t *testing.T, j idem.Journal) {
	ctx := t.Context()
	rec := createDue(t, j, "tenant-a", time.Time{})
	held := acquire(t, j, rec.Key, "worker-A", longLease)

	require.NoError(t, j.Release(ctx, rec.Key, held.Lease))
	released := get(t, j, rec.Key)
	assert.Empty(t, released.Lease.Owner, "Release clears the owner")
	assert.False(t, released.Lease.Held(time.Now()))
	assert.Equal(t, held.State, released.State)
	assert.Equal(t, held.Version, released.Version, "Release keeps the version: it decides nothing, and adds no event")
	assertRequest(t, rec, released)

	// The old holder can no longer write or release.
	next := journal.CloneRecord(released)
	next.Lease = held.Lease
	next.State = idem.StateInFlight
	_, err := j.Update(ctx, next, idem.Durable, idem.Event{})
	require.ErrorIs(t, err, idem.ErrLeaseLost, "update under a released lease")
	require.ErrorIs(t, j.Release(ctx, rec.Key, held.Lease), idem.ErrLeaseLost, "second release")
	requireStored(t, j, released)

	// The record is claimable again.
	got := claim(t, j, idem.ClaimRequest{Owner: "worker-B", Limit: 10, Lease: longLease})
	require.Equal(t, []string{rec.Key}, keysOf(got...), "a released record is claimable")
	assert.Equal(t, held.Lease.Epoch+1, got[0].Lease.Epoch)

	for _, stale := range []idem.Lease{
		held.Lease,
		{Owner: "worker-B", Epoch: held.Lease.Epoch, ExpiresAt: got[0].Lease.ExpiresAt},
		{Owner: "worker-C", Epoch: got[0].Lease.Epoch, ExpiresAt: got[0].Lease.ExpiresAt},
		{},
	} {
		require.ErrorIs(t, j.Release(ctx, rec.Key, stale), idem.ErrLeaseLost, "Release with lease %+v", stale)
	}
	requireStored(t, j, got[0])

	require.ErrorIs(t, j.Release(ctx, uuid.NewString(), got[0].Lease), idem.ErrNotFound)
}
