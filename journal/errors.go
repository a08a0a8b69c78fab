package journal

import (
	"errors"
	"fmt"
)

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

// NotFound is the ErrNotFound a journal returns when nothing has the key or
// the (scope, id) that what names, such as "key 0190…" or "tenant-a/cart-42".
func NotFound(what string) error { return fmt.Errorf("%w: %s", ErrNotFound, what) }

// CursorNotFound is the error a journal's List yields when Filter.After
// names no record: it matches ErrNotFound and says what to do.
func CursorNotFound(key string) error {
	return NotFound(fmt.Sprintf("key %s, the record to list after (Filter.After), is no longer in the journal "+
		"(pruned since it was read?); list again from the start", key))
}

// FingerprintMismatch is the error a journal's Create returns, with the
// existing record, when the operation ID is taken by another request: it
// matches ErrFingerprintMismatch and names the record that holds the ID.
func FingerprintMismatch(existing Record) error {
	return fmt.Errorf("%w: %s/%s is journaled under key %s with fingerprint %.12s…; use a new operation ID for a different request",
		ErrFingerprintMismatch, existing.Scope, existing.ID, existing.Key, existing.Fingerprint)
}
