// Package journal holds what every idem journal shares: the record types,
// the errors, and the rules that decide what a legal write is. It is for
// implementing an idem.Journal (the interface stays in package idem, the
// one a client is given). A client's users need only package idem, which
// declares every type here under the same name as an alias (idem.Record is
// journal.Record) and re-exports the same error values (idem.ErrConflict is
// journal.ErrConflict), so either name matches with errors.Is.
//
// The package is a leaf: it imports nothing of idem, so that the journals
// in package idem (SQLite, memory) and journals in other modules (such as
// the PostgreSQL journal) follow the same rules without an import cycle.
// Names in these docs such as Journal, Journal.Update or Journal.Claim are
// those of the idem.Journal interface.
//
// # Implementing a Journal
//
// A journal stores records; it never decides what a legal write is. Each
// write reads the stored record inside the journal's write transaction (or
// under its lock), calls the rule, and stores exactly what the rule returns,
// appending the returned Event to the record's history:
//
//	Journal.Create   NewRecord; FingerprintMismatch when (Scope, ID) is taken
//	                 by another request; ErrDuplicateKey when Key is taken
//	Journal.Update   CheckDurability, then ApplyUpdate
//	Journal.Claim    CheckClaimRequest; select with Claimable; ApplyClaim
//	Journal.Acquire  ApplyClaim
//	Journal.Renew    ApplyRenew
//	Journal.Release  ApplyRelease
//	Journal.Prune    Prunable
//	Journal.Count    SortCounts
//
// A journal may select in its own query language rather than by calling
// Claimable or Prunable on every record, as long as it selects the same
// records. Errors wrap the sentinels of this package with what was found
// (NotFound builds the one for a missing record), so that callers match
// them with errors.Is. Records go in and out as deep copies (CloneRecord):
// a caller never shares a slice or a map with the journal. Times are
// stored at millisecond precision (TruncateTime).
//
// The rules take the time as an argument and a gone function that reports
// whether a lease's owner is known to be gone (see Journal.Register): a
// journal that cannot observe liveness passes nil, and leases are then
// taken only when they lapse.
//
// # Proving it: journaltest
//
// The conformance suite in package journaltest drives a journal through the
// idem.Journal interface and checks every rule, the concurrency and the
// leases. Run it from an ordinary test of the journal's package, with a
// function that opens a new, empty journal for each subtest:
//
//	func TestConformance(t *testing.T) {
//		journaltest.Run(t, func(t *testing.T) idem.Journal {
//			return openMyJournal(t)
//		})
//	}
//
// The package's types are plain values, safe to copy. Its functions keep no
// state and are safe for concurrent use.
package journal
