package idem

import "context"

// The client's writes to a MemoryJournal leave out the copies that keep a
// caller from sharing memory with a journal (Journal's records go in and
// out as deep copies): its copies of the 1 KiB body, the headers and the
// response were a third of the bytes a Do allocated, and the collector's
// work with them (BENCHMARKS.md, fifth speed session).
//
// The client may share because it never changes a record's request (it
// reads Header and Body to build each attempt) and hands a user only the
// Response, which updateShared returns as the client gave it, not the
// stored copy. Only a *MemoryJournal itself is written so: a type that
// embeds one, to change what Create or Update do, is written through them.

// createRecord is the client's Journal.Create. ownHeader (ownBody) says
// that rec.Header (rec.Body) is the client's own copy, made for this call
// and never changed: a MemoryJournal keeps it as it is.
func (c *Client) createRecord(ctx context.Context, rec Record, ownHeader, ownBody bool) (Record, bool, error) {
	if m, ok := c.journal.(*MemoryJournal); ok {
		return m.createShared(ctx, rec, ownHeader, ownBody)
	}
	return c.journal.Create(ctx, rec)
}

// updateRecord is the client's Journal.Update of an operation it drives.
func (c *Client) updateRecord(ctx context.Context, rec Record, d Durability, why Event) (Record, error) {
	if m, ok := c.journal.(*MemoryJournal); ok {
		return m.updateShared(ctx, rec, d, why)
	}
	return c.journal.Update(ctx, rec, d, why)
}
