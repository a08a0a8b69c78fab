package idem

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"time"
)

// A Journal is the durable record of every operation: its key, the exact
// request, and where it stands. The client writes to it before anything is
// sent and after every answer, so that every retry and every restart reuses
// the same key.
//
// Every method takes a context first and is safe for concurrent use. The
// rules every implementation follows (which updates are legal, how leases
// fence stale writers, which records are claimable) are written once, as the
// functions NewRecord, ApplyUpdate and ApplyClaim, so that the SQLite, memory
// and any other journal behave alike; the conformance suite in package
// journaltest checks them.
//
// Times are stored with millisecond precision.
type Journal interface {
	// Create stores rec unless a record with the same (Scope, ID) exists.
	// It returns the stored record and whether this call created it. When
	// the existing record has another fingerprint it returns that record and
	// an error matching ErrFingerprintMismatch, and changes nothing. A new
	// record must be pending or in_flight; see NewRecord for what the journal
	// fills in. Create is always durable.
	Create(ctx context.Context, rec Record) (Record, bool, error)

	// Get returns the record with the given key, or ErrNotFound.
	Get(ctx context.Context, key string) (Record, error)

	// Lookup returns the record for (scope, id), or ErrNotFound.
	Lookup(ctx context.Context, scope, id string) (Record, error)

	// Update is a compare-and-swap: it applies rec to the stored record with
	// the same key if the stored Version equals rec.Version and rec.Lease
	// still holds the stored lease (see ApplyUpdate for the exact rules), and
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

// A Record is one operation as the journal holds it.
type Record struct {
	// Key is the idempotency key sent with every attempt and status check.
	Key string
	// Scope is the tenant or namespace the operation belongs to.
	Scope string
	// ID is the caller's name for the logical operation, unique in Scope.
	ID string

	// Method, URL, Header and Body are the exact request, re-sent byte for
	// byte on every attempt. Header never holds credentials: those are added
	// on each attempt by the client's Authorize hook and never journaled.
	Method string
	URL    string
	Header http.Header
	Body   []byte
	// Fingerprint is the hex SHA-256 that identifies the request's content
	// (see Fingerprint). The same ID with another fingerprint is refused.
	Fingerprint string
	// KeyHeader is the request header that carries Key, and KeyQuoted says
	// whether the key is sent as an RFC 8941 sf-string rather than a bare
	// token: the key's wire form when the record was created. Every later
	// attempt, replay and status check uses it, whatever the configuration
	// of the client, process or tool that sends it. Required by Create.
	// Records journaled before idem kept the form (SQLite schema 1) read
	// with an empty KeyHeader; they are sent in the sending client's form.
	KeyHeader string
	KeyQuoted bool

	// State is where the operation stands.
	State State
	// Attempts counts the attempts the client started, each a send of the
	// request (a replay made to check the status included).
	Attempts int
	// TransportResends counts the times Go's HTTP transport sent an attempt
	// again by itself, on a new connection, after a reused one died before
	// any reply (net/http does so for requests that carry an idempotency
	// key). Each may have reached the server; none is in Attempts.
	TransportResends int
	// NextAttemptAt is when the operation is next due; Claim skips records
	// whose time has not come.
	NextAttemptAt time.Time
	// Lease says which worker drives the operation, until when.
	Lease Lease

	// Response is the server's answer once it is known.
	Response *Response
	// LastError says why the last attempt or status check did not settle the
	// operation, or why an operator settled it.
	LastError string
	// Note is an operator's note, set by Reconcile.
	Note string

	// CreatedAt and UpdatedAt are set by the journal.
	CreatedAt time.Time
	UpdatedAt time.Time
	// ExpiresAt is when the server may forget the key: it is set when a
	// request first may reach the server, and an operation still unsettled
	// after it is expired rather than re-sent. Zero while nothing was sent.
	ExpiresAt time.Time
	// Version increments on every change; Update compares it.
	Version int64
}

// A Lease is a worker's exclusive right to drive an operation until
// ExpiresAt. Epoch increments each time the record is claimed or acquired,
// so a worker that lost its lease is fenced out as long as it writes with
// the lease it was given (see ApplyUpdate). The zero Lease means nobody
// holds the record.
type Lease struct {
	Owner     string
	Epoch     int64
	ExpiresAt time.Time
}

// Held reports whether the lease is owned and not expired at now.
func (l Lease) Held(now time.Time) bool { return l.Owner != "" && now.Before(l.ExpiresAt) }

// A Response is the server's answer to an operation, as journaled.
// Set-Cookie and the client's secret headers are never stored.
type Response struct {
	StatusCode int
	Header     http.Header
	Body       []byte
	// Replayed reports that the server said it answered from its own store
	// of keys (an Idempotent-Replayed header or a status check).
	Replayed bool
}

// An Event is one entry of a record's append-only history: every Create,
// Update, Claim and Acquire appends one, so the history tells why the
// operation went where it went.
type Event struct {
	// Version is the record's version after the change.
	Version int64
	At      time.Time
	// Kind says what happened; Detail says it in words, such as why an
	// attempt was sent again or what a status check answered.
	Kind   EventKind
	Detail string
	// From is zero for the event that created the record.
	From, To State
	// Attempt is the record's attempt count after the change.
	Attempt int
	// StatusCode is the server's status when the change recorded an answer.
	StatusCode int
	// Error is the record's LastError, or the operator's note.
	Error string
	// Owner is the lease owner that made the change, if any.
	Owner string
}

// EventKind says what an Event records.
type EventKind uint8

const (
	// EventUpdate is a change with no more specific kind, and every event
	// of a journal written before events had kinds.
	EventUpdate EventKind = iota
	// EventCreate: the record was created, pending (Begin) or in_flight
	// (Do, which sends it at once).
	EventCreate
	// EventSend: an attempt starts. Detail says why it is sent (again).
	EventSend
	// EventAnswer: an attempt ended, and what it got (or did not get)
	// decided the state.
	EventAnswer
	// EventStatus: a status check, and its answer or why it failed.
	EventStatus
	// EventClaim: a worker took the lease; Detail names the previous
	// holder and why its lease could be taken.
	EventClaim
	// EventStop: a call stopped with the operation unsettled; Detail says
	// when it is due again.
	EventStop
	// EventExpire: the server's key retention passed, or the server was
	// found not to honour keys: nothing more is sent.
	EventExpire
	// EventOperator: an operator's decision (Reconcile, Cancel).
	EventOperator
)

var eventKindNames = [...]string{EventUpdate: "update", EventCreate: "create", EventSend: "send",
	EventAnswer: "answer", EventStatus: "status", EventClaim: "claim", EventStop: "stop",
	EventExpire: "expire", EventOperator: "operator"}

// String returns the kind's name, such as "status".
func (k EventKind) String() string {
	if int(k) < len(eventKindNames) {
		return eventKindNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Filter selects records for List. The zero Filter matches every record.
type Filter struct {
	// Scope, when not empty, restricts to one scope.
	Scope string
	// States, when not empty, restricts to these states.
	States []State
	// CreatedBefore, when not zero, restricts to records created before it.
	CreatedBefore time.Time
}

// Match reports whether rec passes the filter.
func (f Filter) Match(rec Record) bool {
	if f.Scope != "" && rec.Scope != f.Scope {
		return false
	}
	if !f.CreatedBefore.IsZero() && !rec.CreatedAt.Before(f.CreatedBefore) {
		return false
	}
	if len(f.States) == 0 {
		return true
	}
	for _, s := range f.States {
		if rec.State == s {
			return true
		}
	}
	return false
}

// ClaimRequest asks Claim for work.
type ClaimRequest struct {
	// Owner names the worker; it must not be empty.
	Owner string
	// Limit is the most records to claim; it must be positive.
	Limit int
	// Lease is how long the claim holds; it must be positive.
	Lease time.Duration
	// Scope, when not empty, restricts the claim to one scope.
	Scope string
	// DueBy, when not zero, claims only records due by then rather than
	// by now: a caller that sweeps the journal once passes the time it
	// started, so that what it left unsettled (due again a little later)
	// is not claimed again in the same sweep.
	DueBy time.Time
	// URLPrefix, when not empty, restricts the claim to records whose URL
	// starts with it, such as "https://api.example.com/": a client claims
	// only the operations meant for the API it holds credentials for.
	URLPrefix string
}

// Count is the number of records in one scope and state.
type Count struct {
	Scope  string
	State  State
	N      int
	Oldest time.Time
}

// Durability says when a journal write may return; see Journal.Update.
// The zero value is Durable.
type Durability uint8

const (
	// Durable returns only after the write is on disk.
	Durable Durability = iota
	// Deferred may return before the write is on disk; it becomes durable
	// with the next durable write or the journal's next flush. A crash of
	// the process keeps it; a power failure may lose it.
	Deferred
	// Buffered may return before the write is committed: reads through the
	// same journal see it at once, other processes once it is committed,
	// with the next write that is not buffered or within about a
	// millisecond. A crash of the process or the machine before then may
	// lose it, and the record then reads as it was. The journal still
	// checks the write when it is made (version, lease) and returns its
	// error. Use it only for a write whose loss a status check repairs,
	// such as a success the server keeps and replays.
	Buffered
)

// check refuses a Durability that is none of the three.
func (d Durability) check() error {
	if d > Buffered {
		return fmt.Errorf("%w: durability %d is not Durable, Deferred or Buffered", ErrInvalidRecord, uint8(d))
	}
	return nil
}

func (d Durability) String() string {
	switch d {
	case Durable:
		return "durable"
	case Deferred:
		return "deferred"
	case Buffered:
		return "buffered"
	}
	return fmt.Sprintf("Durability(%d)", uint8(d))
}

// DefaultMaxBodySize is the largest request body a journal accepts unless
// configured otherwise: 1 MiB.
const DefaultMaxBodySize = 1 << 20

// Errors shared by all journals. Journals wrap them with the key and what
// was found, so match them with errors.Is.
var (
	// ErrNotFound: no record has that key or (scope, id).
	ErrNotFound = errors.New("idem: operation not found in the journal")
	// ErrFingerprintMismatch: the operation ID is already journaled with a
	// different request. Nothing was sent and the first record is untouched.
	ErrFingerprintMismatch = errors.New("idem: operation ID already used with a different request")
	// ErrConflict: the record changed since it was read (its version moved
	// on); read it again and decide again.
	ErrConflict = errors.New("idem: journal record changed concurrently")
	// ErrLeaseLost: the writer's lease was taken over or released; the
	// writer must stop driving the operation.
	ErrLeaseLost = errors.New("idem: lease lost to another worker")
	// ErrLeased: another worker holds a live lease on the record.
	ErrLeased = errors.New("idem: operation is leased by another worker")
	// ErrNotActive: the record is not pending, in_flight or unknown, so it
	// cannot be leased.
	ErrNotActive = errors.New("idem: operation is not active")
	// ErrIllegalTransition: the state machine does not allow the move.
	ErrIllegalTransition = errors.New("idem: illegal state transition")
	// ErrDuplicateKey: the key is already used by another operation.
	ErrDuplicateKey = errors.New("idem: idempotency key already used by another operation")
	// ErrBodyTooLarge: the request body exceeds the journal's limit.
	ErrBodyTooLarge = errors.New("idem: request body too large for the journal")
	// ErrInvalidRecord: a record is missing a required field.
	ErrInvalidRecord = errors.New("idem: invalid journal record")
	// ErrJournalClosed: the journal was closed.
	ErrJournalClosed = errors.New("idem: journal is closed")
)
