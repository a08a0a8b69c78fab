package journal

import (
	"fmt"
	"net/http"
	"time"
)

// A Record is one operation as the journal holds it. A Record is a plain
// value: journals store and return deep copies (see CloneRecord), so a
// Record read from a journal is not shared with it.
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
	// (see idem.Fingerprint). The same ID with another fingerprint is refused.
	Fingerprint string
	// KeyHeader is the request header that carries Key, and KeyQuoted says
	// whether the key is sent as an RFC 8941 sf-string rather than a bare
	// token: the key's wire form when the record was created. Every later
	// attempt, replay and status check uses it, whatever the configuration
	// of the client, process or tool that sends it. Required by NewRecord.
	// Records journaled before idem kept the form (SQLite schema 1) read
	// with an empty KeyHeader; they are sent in the sending client's form.
	KeyHeader string
	KeyQuoted bool

	// State is where the operation stands.
	State State
	// Attempts counts the attempts the client journaled, each a send of
	// the request (a replay made to check the status included). A send
	// that Config.Authorize stopped is journaled as none, except Do's
	// first, which its create journaled with the operation: that one
	// stays counted, unsent, on a pending record whose LastError starts
	// "journaled attempt not sent", and the next send reuses it rather
	// than count another. (OperationError.Attempts leaves it out.)
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
	// Note is an operator's note, set by the client's Reconcile.
	Note string
	// Link relates the operation to the call that created it (a W3C
	// traceparent, from the client's Hooks.Link), so that the spans of a
	// later call, Resume after a crash say, can link to that trace. Set
	// when the record is created, never changed, never secret.
	Link string

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

// MaxLinkLength is the longest Record.Link a journal accepts.
const MaxLinkLength = 512

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
	// After, when not empty, is the key of a record: List starts after
	// that record in its order (creation order), whether or not the record
	// matches the rest of the filter. It is a cursor for paging through a
	// journal without holding it: pass the key of the last record seen to
	// get the next page. When no record has that key (it was pruned since),
	// List yields one error matching ErrNotFound and nothing else, rather
	// than guess where the page was.
	After string
}

// Match reports whether rec passes the filter's Scope, States and
// CreatedBefore. It does not consider After, which is a position in
// List's order rather than a property of the record.
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

// Durability says when a journal write may return: the durability a
// caller asks of idem.Journal.Update, which says which writes may use the
// weaker two. The zero value is Durable. A journal refuses any other value
// (see CheckDurability).
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

// String returns the durability's name, such as "deferred".
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
