package idem

import (
	"context"
	"iter"
	"time"

	"github.com/idemkit/idem/journal"
)

// A Journal is the durable record of every operation: its key, the exact
// request, and where it stands. The client writes to it before anything is
// sent and after every answer, so that every retry and every restart reuses
// the same key.
//
// Every method takes a context first and is safe for concurrent use. The
// rules every implementation follows (which updates are legal, how leases
// fence stale writers, which records are claimable) are written once, in
// package [journal] (journal.NewRecord, journal.ApplyUpdate,
// journal.ApplyClaim, ...), so that the SQLite, memory and any other
// journal behave alike; the conformance suite in package journaltest checks
// them. Only a journal's author needs package journal.
//
// Times are stored with millisecond precision.
type Journal interface {
	// Create stores rec unless a record with the same (Scope, ID) exists.
	// It returns the stored record and whether this call created it. When
	// the existing record has another fingerprint it returns that record and
	// an error matching ErrFingerprintMismatch, and changes nothing. A new
	// record must be pending or in_flight; see journal.NewRecord for what the journal
	// fills in. Create is always durable.
	Create(ctx context.Context, rec Record) (Record, bool, error)

	// Get returns the record with the given key, or ErrNotFound.
	Get(ctx context.Context, key string) (Record, error)

	// Lookup returns the record for (scope, id), or ErrNotFound.
	Lookup(ctx context.Context, scope, id string) (Record, error)

	// Update is a compare-and-swap: it applies rec to the stored record with
	// the same key if the stored Version equals rec.Version and rec.Lease
	// still holds the stored lease (see journal.ApplyUpdate for the exact
	// rules), and
	// appends one Event to the record's history: why's Kind and Detail say
	// what happened, the journal fills in the rest. It returns the new
	// record. Exactly one of two racing writers wins; the other gets
	// ErrConflict, ErrLeaseLost or ErrLeased and nothing changes.
	//
	// d says when Update may return. Durable returns after the write is on
	// disk. Deferred may return before, and the write becomes durable with
	// the next durable write or within the journal's flush interval.
	// Buffered may return before the write is even committed. Use the
	// weaker two only for writes whose loss is harmless because the
	// previous state leads to the same end (a success recorded over
	// in_flight: if lost, the record reads in_flight and resumes as a status
	// check, which the server answers with the same response). A value
	// other than these three is refused with ErrInvalidRecord.
	Update(ctx context.Context, rec Record, d Durability, why Event) (Record, error)

	// Claim leases up to req.Limit active records whose NextAttemptAt has
	// come and whose lease is free, expired, or held by an owner known to
	// be gone (see Register), to req.Owner for req.Lease, oldest due first.
	// Each claim increments the record's lease epoch, so a worker whose
	// lease was taken over is fenced out, and appends an EventClaim naming
	// the previous holder and why its lease was taken. A request without an
	// owner, a positive limit and a positive lease is ErrInvalidRecord.
	Claim(ctx context.Context, req ClaimRequest) ([]Record, error)

	// Acquire leases the record with the given key to owner for lease,
	// whatever its NextAttemptAt, as Claim does. When a lease is still live
	// and its owner is not known to be gone (whoever holds it, this owner
	// included) it returns the current record and ErrLeased; when the
	// record is not active it returns the current record and ErrNotActive.
	Acquire(ctx context.Context, key, owner string, lease time.Duration) (Record, error)

	// Renew extends each lease in held, a map from key to the lease its
	// holder was given by Claim, Acquire or Create, to now+lease, if that
	// lease (owner and epoch) is still the record's, and reports how many it
	// extended. Leases are renewed by key and epoch, never by owner name, so
	// a process restarted under the same name never renews the leases of
	// the one that died. Renew does not change the records' versions, so a
	// holder's next Update still succeeds. Renew is deferred: a lost renewal
	// only lets a lease expire sooner.
	Renew(ctx context.Context, held map[string]Lease, lease time.Duration) (int, error)

	// Register tells the journal that owner is a live worker until
	// unregister is called or its process ends, whichever comes first, so
	// that Claim and Acquire can take the leases of an owner that is gone
	// at once, instead of when they lapse. Owner names must be unique per
	// registration: a process that restarts registers a new name. A journal
	// that cannot observe liveness (one shared by several machines, say)
	// accepts the registration and lets leases lapse; a lease of an owner
	// that never registered is taken only when it lapses.
	Register(ctx context.Context, owner string) (unregister func() error, err error)

	// Sync makes every write the journal has accepted so far durable,
	// buffered and deferred ones included. Client.Close and Shutdown call
	// it, so that a clean exit loses nothing.
	Sync(ctx context.Context) error

	// Release gives up the lease l on the record with the given key. It
	// returns ErrLeaseLost if l is no longer the record's lease, which is
	// also the case once an Update has taken the record out of the active
	// states.
	Release(ctx context.Context, key string, l Lease) error

	// List iterates over the records that match f, oldest first. It reads
	// in pages, so it never holds the whole journal in memory nor blocks
	// writers for long; records written during the iteration may or may not
	// be seen. Stop early by breaking out of the loop.
	List(ctx context.Context, f Filter) iter.Seq2[Record, error]

	// Count returns the number of records for every (scope, state) pair that
	// has any, with the creation time of the oldest, ordered by scope and
	// then state.
	Count(ctx context.Context) ([]Count, error)

	// History returns the record's events, oldest first, or ErrNotFound.
	History(ctx context.Context, key string) ([]Event, error)

	// Prune deletes terminal records (succeeded, rejected, canceled) last
	// updated before the cut-off, with their history, and reports how many
	// it deleted. Expired records wait for an operator and are kept.
	Prune(ctx context.Context, before time.Time) (int, error)

	// Close releases the journal's resources. Calls after Close fail with
	// ErrJournalClosed.
	Close() error
}

// The types a journal holds are declared in package journal, where their
// documentation is; these are the same types under their idem names.
type (
	// A Record is one operation as the journal holds it: the key, the
	// exact request, the key's wire form, and where the operation stands.
	// See journal.Record for its fields.
	Record = journal.Record
	// A Lease is a worker's exclusive right to drive an operation.
	Lease = journal.Lease
	// A Response is the server's answer to an operation, as journaled.
	Response = journal.Response
	// An Event is one entry of a record's append-only history. See
	// journal.Event for its fields.
	Event = journal.Event
	// EventKind says what an Event records.
	EventKind = journal.EventKind
	// Filter selects records for List. The zero Filter matches every
	// record.
	Filter = journal.Filter
	// ClaimRequest asks Claim for work.
	ClaimRequest = journal.ClaimRequest
	// Count is the number of records in one scope and state.
	Count = journal.Count
	// Durability says when a journal write may return; see Journal.Update
	// and journal.Durability. The zero value is Durable.
	Durability = journal.Durability
)

// The kinds of Event; see journal.EventKind.
const (
	EventUpdate   = journal.EventUpdate
	EventCreate   = journal.EventCreate
	EventSend     = journal.EventSend
	EventAnswer   = journal.EventAnswer
	EventStatus   = journal.EventStatus
	EventClaim    = journal.EventClaim
	EventStop     = journal.EventStop
	EventExpire   = journal.EventExpire
	EventOperator = journal.EventOperator
)

// The durabilities of a journal write; see journal.Durability.
const (
	// Durable returns only after the write is on disk.
	Durable = journal.Durable
	// Deferred may return before the write is on disk; a power failure
	// may lose it.
	Deferred = journal.Deferred
	// Buffered may return before the write is committed; a crash may lose
	// it.
	Buffered = journal.Buffered
)

// DefaultMaxBodySize is the largest request body a journal accepts unless
// configured otherwise: 1 MiB.
const DefaultMaxBodySize = journal.DefaultMaxBodySize

// Errors shared by all journals, the same values as package journal's.
// Journals wrap them with the key and what was found, so match them with
// errors.Is.
var (
	// ErrNotFound: no record has that key or (scope, id).
	ErrNotFound = journal.ErrNotFound
	// ErrFingerprintMismatch: the operation ID is already journaled with a
	// different request. Nothing was sent and the first record is untouched.
	ErrFingerprintMismatch = journal.ErrFingerprintMismatch
	// ErrConflict: the record changed since it was read (its version moved
	// on); read it again and decide again.
	ErrConflict = journal.ErrConflict
	// ErrLeaseLost: the writer's lease was taken over or released; the
	// writer must stop driving the operation.
	ErrLeaseLost = journal.ErrLeaseLost
	// ErrLeased: another worker holds a live lease on the record.
	ErrLeased = journal.ErrLeased
	// ErrNotActive: the record is not pending, in_flight or unknown, so it
	// cannot be leased.
	ErrNotActive = journal.ErrNotActive
	// ErrIllegalTransition: the state machine does not allow the move.
	ErrIllegalTransition = journal.ErrIllegalTransition
	// ErrDuplicateKey: the key is already used by another operation.
	ErrDuplicateKey = journal.ErrDuplicateKey
	// ErrBodyTooLarge: the request body exceeds the journal's limit.
	ErrBodyTooLarge = journal.ErrBodyTooLarge
	// ErrInvalidRecord: a record is missing a required field.
	ErrInvalidRecord = journal.ErrInvalidRecord
	// ErrJournalClosed: the journal was closed.
	ErrJournalClosed = journal.ErrJournalClosed
)

// CommitInfo describes one transaction a journal committed, for the
// journals' commit hooks (SQLiteOnCommit): group commit shares one
// transaction among the writes of many operations.
type CommitInfo struct {
	// Writes is the number of journal writes the transaction committed.
	Writes int
	// Durable reports that the commit waited for the disk (fsync).
	Durable bool
	// Duration is the time from the start of the batch to the end of the
	// commit: the longest any of its writers waited.
	Duration time.Duration
}
