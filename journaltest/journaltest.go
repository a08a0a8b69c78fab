// Package journaltest is the conformance suite that every idem.Journal
// implementation must pass, so that the memory, SQLite and any other journal
// behave alike.
//
// # Using it
//
// A journal author calls Run from an ordinary test in the journal's package,
// with a function that opens a fresh journal:
//
//	func TestSQLiteJournalConformance(t *testing.T) {
//		journaltest.Run(t, func(t *testing.T) idem.Journal {
//			j, err := idem.OpenSQLite(filepath.Join(t.TempDir(), "ops.db"))
//			require.NoError(t, err)
//			return j
//		})
//	}
//
// Run calls open once per subtest, from inside that subtest (so open may use
// t.TempDir, t.Cleanup and require), and closes the journal when the subtest
// ends. open must return a new, empty journal every time, never one shared
// with another subtest: subtests run in parallel and list, count, claim and
// prune everything they find. Run checks that the journal starts empty.
//
// # What the journal must provide
//
// The rules the suite checks are written once, in package
// github.com/idemkit/idem/journal: a journal that reads the stored record
// inside its write transaction, calls the rule (journal.NewRecord,
// journal.ApplyUpdate, journal.ApplyClaim, ...) and stores what it returns
// agrees with them; what the suite proves beyond that is the storage, the
// atomicity under concurrency and the leases.
//
// The suite drives the journal through the Journal interface only. The
// journal must read the wall clock (time.Now): the lease tests take real
// 50 ms leases and wait, with generous deadlines, for them to run out. It
// must accept request bodies up to idem.DefaultMaxBodySize and refuse larger
// ones. Times are compared with a millisecond of tolerance, the precision
// journals store.
//
// Run the suite with the race detector (go test -race); the concurrency
// subtests race real goroutines against the journal. Every subtest has a
// stable name, so one can be run alone, for example
// go test -run 'Conformance/Leases/FencingAfterTakeover'.
package journaltest

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// Timing of the suite. Leases that must expire are short and real; every
// wait has a generous deadline because the machine running the suite may be
// shared and slow, and no assertion depends on how fast the wait ends.
const (
	shortLease = 50 * time.Millisecond
	longLease  = 10 * time.Minute
	waitFor    = 5 * time.Second
	pollEvery  = 2 * time.Millisecond
	// ms is the storage precision of journal times, the tolerance of every
	// time comparison.
	ms = time.Millisecond
)

type subtest struct {
	name string
	run  func(t *testing.T, j idem.Journal)
}

type group struct {
	name  string
	tests []subtest
}

// groups is the whole suite, in the order Run starts it.
var groups = []group{
	{"Create", []subtest{
		{"NewRecord", testCreateNewRecord},
		{"RoundTrip", testCreateRoundTrip},
		{"ExistingSameFingerprint", testCreateExisting},
		{"FingerprintMismatch", testCreateFingerprintMismatch},
		{"DuplicateKey", testCreateDuplicateKey},
		{"SameIDOtherScope", testCreateSameIDOtherScope},
		{"KeyWireForm", testCreateKeyWireForm},
		{"Link", testCreateLink},
		{"Invalid", testCreateInvalid},
	}},
	{"Read", []subtest{
		{"GetLookup", testGetLookup},
		{"NotFound", testReadNotFound},
		{"ReturnsCopies", testReturnsCopies},
	}},
	{"Update", []subtest{
		{"CompareAndSwap", testUpdateCAS},
		{"StaleVersion", testUpdateStaleVersion},
		{"Transitions", testUpdateTransitions},
		{"ImmutableFields", testUpdateImmutable},
		{"Response", testUpdateResponse},
		{"LeavingActiveClearsLease", testUpdateClearsLease},
		{"AttemptsDown", testUpdateAttemptsDown},
		{"Durability", testUpdateDurability},
		{"BufferedIsReadAtOnce", testUpdateBufferedIsReadAtOnce},
		{"InvalidDurability", testUpdateInvalidDurability},
		{"SyncAfterBuffered", testUpdateSync},
		{"NotFound", testUpdateNotFound},
	}},
	{"Leases", []subtest{
		{"ClaimSelection", testClaimSelection},
		{"ClaimLimitOrder", testClaimLimitOrder},
		{"ClaimScope", testClaimScope},
		{"ClaimURLPrefix", testClaimURLPrefix},
		{"ClaimDueBy", testClaimDueBy},
		{"ClaimInvalidRequest", testClaimInvalid},
		{"ClaimAfterExpiry", testClaimAfterExpiry},
		{"Acquire", testAcquire},
		{"HolderUpdate", testHolderUpdate},
		{"HolderSetsExpiry", testHolderSetsExpiry},
		{"UnleasedWriteWhileLeased", testUnleasedWrite},
		{"FencingAfterTakeover", testFencing},
		{"Renew", testRenew},
		{"RenewByEpoch", testRenewByEpoch},
		{"GoneOwner", testGoneOwner},
		{"Register", testRegister},
		{"Release", testRelease},
	}},
	{"List", []subtest{
		{"Filters", testListFilters},
		{"CreationOrder", testListOrder},
		{"EarlyBreak", testListEarlyBreak},
		{"Thousand", testListThousand},
		{"WritesDuringIteration", testListWrites},
		{"PagedAfter", testListAfter},
		{"AfterUnknownKey", testListAfterUnknown},
	}},
	{"Count", []subtest{
		{"ScopeState", testCount},
	}},
	{"History", []subtest{
		{"Events", testHistory},
		{"Takeover", testHistoryTakeover},
		{"OperatorNote", testHistoryNote},
		{"NotFound", testHistoryNotFound},
	}},
	{"Prune", []subtest{
		{"TerminalBeforeCutoff", testPrune},
	}},
	{"Close", []subtest{
		{"CallsAfterClose", testClose},
	}},
	{"Context", []subtest{
		{"Canceled", testContextCanceled},
	}},
	{"Concurrency", []subtest{
		{"CreateSameID", testConcurrentCreate},
		{"UpdateSameVersion", testConcurrentUpdate},
		{"AcquireSameRecord", testConcurrentAcquire},
		{"ClaimDisjoint", testConcurrentClaim},
		{"FenceAfterTakeover", testConcurrentFence},
	}},
}

// Run runs the conformance suite against journals made by open. open is
// called once per subtest and must return a new, empty journal; Run closes it
// when the subtest ends.
func Run(t *testing.T, open func(t *testing.T) idem.Journal) {
	t.Helper()
	if open == nil {
		t.Fatal("journaltest.Run: open is nil")
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, st := range g.tests {
				t.Run(st.name, func(t *testing.T) {
					t.Parallel()
					st.run(t, openJournal(t, open))
				})
			}
		})
	}
}

// openJournal opens a journal for one subtest, checks that it is empty and
// closes it when the subtest ends. A journal the subtest closed itself may
// answer the second Close with ErrJournalClosed.
func openJournal(t *testing.T, open func(t *testing.T) idem.Journal) idem.Journal {
	t.Helper()
	j := open(t)
	require.NotNil(t, j, "open returned a nil journal")
	t.Cleanup(func() {
		closed := make(chan error, 1)
		go func() { closed <- j.Close() }()
		select {
		case err := <-closed:
			if err != nil && !errors.Is(err, idem.ErrJournalClosed) {
				t.Errorf("closing the journal: %v", err)
			}
		case <-hung(t):
			t.Errorf("Close did not return before the test binary's deadline: the journal hangs or deadlocks")
		}
	})
	counts, err := j.Count(t.Context())
	require.NoError(t, err)
	require.Empty(t, counts, "open must return a new, empty journal")
	return j
}
