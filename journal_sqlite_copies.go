package idem

import (
	"sync"

	"github.com/idemkit/idem/internal/sqlitefile"
	"github.com/idemkit/idem/internal/wire"
)

// copies remembers the records of active operations as this journal last
// wrote them, with their row ids, so that the next Update of one judges the
// write against the copy instead of reading the row back: the read was the
// largest statement of a Do's outcome. The row is written only if it still
// is that copy: the same version, and the same lease (a renewal changes the
// lease's expiry, and nothing else, without a new version). When another
// process (or a renewal) changed it, nothing is written, and the Update
// reads the row and is judged against it, as without the copy.
//
// A copy is only as good as the transaction that wrote it: every rollback
// forgets them all (forget, called with the dict's). Only active records
// are kept, at most maxCopies: an operation is updated until it settles.
type copies struct {
	mu   sync.Mutex
	rows map[string]rowCopy
}

type rowCopy struct {
	id  int64
	rec Record
}

const maxCopies = 4096

func (c *copies) get(key string) (rowCopy, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rc, ok := c.rows[key]
	return rc, ok
}

// put remembers rec as row id's contents, or forgets it once settled. It
// keeps rec itself, not a copy (put runs in the committer, which every
// write waits for): the caller must not change rec, and hands its own
// caller a copy, made outside the committer, of an active record.
func (c *copies) put(id int64, rec Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !rec.State.Active() {
		delete(c.rows, rec.Key)
		return
	}
	if c.rows == nil {
		c.rows = make(map[string]rowCopy)
	}
	if _, ok := c.rows[rec.Key]; ok || len(c.rows) < maxCopies {
		c.rows[rec.Key] = rowCopy{id: id, rec: rec}
	}
}

func (c *copies) drop(key string) {
	c.mu.Lock()
	delete(c.rows, key)
	c.mu.Unlock()
}

func (c *copies) forget() {
	c.mu.Lock()
	c.rows = nil
	c.mu.Unlock()
}

// updateFromCopy applies an Update to the row id whose contents were old,
// if they still are. It reports whether it wrote: false means the row
// changed since old was written, nothing was written, and the caller must
// read the row.
func (j *SQLiteJournal) updateFromCopy(tx *sqlitefile.Tx, id int64, old, next Record, ev Event) (bool, error) {
	owner, err := j.dict.intern(tx, []byte(old.Lease.Owner))
	if err != nil {
		return false, err
	}
	return j.dict.storeUpdate(tx, id, old, next, ev,
		` AND version = ? AND lease_owner IS ? AND lease_epoch = ? AND lease_expires_at IS ?`,
		old.Version, owner, old.Lease.Epoch, wire.NullMillis(old.Lease.ExpiresAt))
}
