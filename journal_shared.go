package idem

import "context"

// sharingJournal is a journal that can leave out, for the client's own
// writes, the copies that keep a caller from sharing memory with it
// (Journal's records go in and out as deep copies). MemoryJournal is one:
// its copies of the 1 KiB body, the headers and the response were a third
// of the bytes a Do allocated, and the collector's work with them.
//
// The client may share because it never changes a record's request (it
// reads Header and Body to build each attempt) and hands a user only the
// Response, which updateShared returns as the client gave it, not the
// stored copy.
type sharingJournal interface {
	// createShared is Create, whose created record is the stored one:
	// the caller must not change its Header or Body. keepHeader says
	// that rec.Header is the caller's own copy, made for this call and
	// never changed: it is kept as it is, not copied.
	createShared(ctx context.Context, rec Record, keepHeader bool) (Record, bool, error)
	// updateShared is Update, whose record shares its request with the
	// stored one and whose Response is rec's.
	updateShared(ctx context.Context, rec Record, d Durability, why Event) (Record, error)
}

// createRecord is the client's Journal.Create; ownHeader as createShared's
// keepHeader.
func (c *Client) createRecord(ctx context.Context, rec Record, ownHeader bool) (Record, bool, error) {
	if s, ok := c.journal.(sharingJournal); ok {
		return s.createShared(ctx, rec, ownHeader)
	}
	return c.journal.Create(ctx, rec)
}

// updateRecord is the client's Journal.Update of an operation it drives.
func (c *Client) updateRecord(ctx context.Context, rec Record, d Durability, why Event) (Record, error) {
	if s, ok := c.journal.(sharingJournal); ok {
		return s.updateShared(ctx, rec, d, why)
	}
	return c.journal.Update(ctx, rec, d, why)
}
