package idem

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/google/uuid"

	"github.com/idemkit/idem/internal/sqlitefile"
	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/journal"
)

// journalAppID marks a file as an idem journal ("idmj").
const journalAppID = sqlitefile.JournalAppID

// journalSchema[i] migrates the journal schema from version i to i+1.
//
// The layout keeps what one operation writes small, because every page a
// commit touches is written to the WAL and fsynced:
//
//   - keys that are canonical UUIDs are stored as their 16 bytes and hex
//     SHA-256 fingerprints as their 32 (columns declared BLOB keep whatever
//     type they are given, so other keys stay text);
//   - the server's response is in the operation's row (schema 4; it had a
//     table of its own before, so that the row never grew, at the cost of
//     one more b-tree page written by every settle);
//   - values that repeat from one record to the next (lease owners, in the
//     row and in every event, and request header sets, the same for most
//     operations of a client) are stored once in dict and referred to by
//     number;
//   - Claim finds due operations through an index on (state DESC,
//     next_attempt_at): descending (schema 6) so that a settle moves an
//     entry within one leaf. It is not a partial index on the active states,
//     which would be smaller: SQLite runs an UPDATE that moves a row out of
//     a partial index through a temporary b-tree, allocated and freed on
//     every settle, which costs more than the index's entries.
var journalSchema = []string{
	`CREATE TABLE operations (
		id               INTEGER PRIMARY KEY,
		key              BLOB NOT NULL UNIQUE,
		scope            TEXT NOT NULL,
		op_id            TEXT NOT NULL,
		method           TEXT NOT NULL,
		url              TEXT NOT NULL,
		header           INTEGER,
		body             BLOB,
		fingerprint      BLOB NOT NULL,
		state            INTEGER NOT NULL,
		attempts         INTEGER NOT NULL,
		next_attempt_at  INTEGER NOT NULL,
		lease_owner      INTEGER,
		lease_epoch      INTEGER NOT NULL,
		lease_expires_at INTEGER,
		last_error       TEXT,
		note             TEXT,
		created_at       INTEGER NOT NULL,
		updated_at       INTEGER NOT NULL,
		expires_at       INTEGER,
		version          INTEGER NOT NULL,
		UNIQUE (scope, op_id)
	);
	CREATE INDEX operations_due ON operations (state, next_attempt_at);
	CREATE TABLE responses (
		op       INTEGER PRIMARY KEY,
		status   INTEGER NOT NULL,
		header   BLOB,
		body     BLOB,
		replayed INTEGER NOT NULL
	);
	CREATE TABLE dict (
		id    INTEGER PRIMARY KEY,
		value BLOB NOT NULL UNIQUE
	);
	CREATE TABLE events (
		op         INTEGER NOT NULL,
		version    INTEGER NOT NULL,
		at         INTEGER NOT NULL,
		from_state INTEGER,
		to_state   INTEGER NOT NULL,
		attempt    INTEGER NOT NULL,
		status     INTEGER,
		error      TEXT,
		owner      INTEGER,
		PRIMARY KEY (op, version)
	) WITHOUT ROWID;`,

	// 2: the key's wire form, the transport's own re-sends, and why each
	// event happened. Each is packed into one column that is NULL in the
	// common case (the default header, bare, no re-send; an event of the
	// kind its states imply, without detail), so that the happy path adds
	// two bytes to what an operation writes: rows that grow by a few bytes
	// more fit fewer to a page, and a journal grew by 5 % when these were
	// five columns. See packForm and packWhy.
	`ALTER TABLE operations ADD COLUMN form INTEGER DEFAULT 2;
	ALTER TABLE events ADD COLUMN why;`,

	// 3: the link to the trace that created the operation (Record.Link),
	// NULL when the client has no Hooks.Link.
	`ALTER TABLE operations ADD COLUMN link TEXT;`,

	// 4: the response in the operation's row, written by the UPDATE that
	// settles it, instead of a table of its own: one statement and one WAL
	// frame fewer per operation (the responses table's leaf, written by
	// every settle), measured in BENCHMARKS.md ("Fourth speed session").
	// The row now grows when it settles; with one caller the row settled
	// is on the table's last page, which is still being filled. From this
	// version on, a record's creation event is also not written by Create
	// but derived from the record while it is at its first version, and
	// written by the write that moves it past (storeRecordIf): one leaf
	// fewer in the intent's commit. A build of an earlier schema, which
	// would read such a record without its creation event, refuses the file.
	`ALTER TABLE operations ADD COLUMN resp_status INTEGER;
	ALTER TABLE operations ADD COLUMN resp_header BLOB;
	ALTER TABLE operations ADD COLUMN resp_body BLOB;
	ALTER TABLE operations ADD COLUMN resp_replayed INTEGER;
	UPDATE operations SET (resp_status, resp_header, resp_body, resp_replayed) =
		(SELECT status, header, body, replayed FROM responses WHERE op = operations.id)
		WHERE id IN (SELECT op FROM responses);
	DROP TABLE responses;`,

	// 5: the history of an operation settled by its first update, when it
	// is what the row implies (created in_flight, then answered by the
	// same owner: a Do whose first attempt was answered), is not written
	// but derived from the row (derivedHistory), which keeps the settler
	// in lease_owner: two statements and one b-tree leaf fewer per Do,
	// measured in BENCHMARKS.md ("Sixth speed session"). The data needs
	// no change; the version makes a build of schema 4, which would read
	// such a record without its history, refuse the file.
	`SELECT 1;`,

	// 6: the due index in descending state order, so that a settle writes
	// one of its leaves instead of two. A settle moves a record's entry
	// from the in-flight range, which holds the few operations in flight,
	// to the end of the succeeded range (its due time is zero, so its
	// entries are in row order, the newest last). In ascending order
	// unknown and in-flight come before succeeded and the two places are
	// on different leaves; in descending order (7 … 1) the end of the
	// succeeded range is followed by the unknown and in-flight ranges, on
	// the same leaf while few operations are in flight: one WAL frame
	// fewer per operation, measured in BENCHMARKS.md ("Seventh speed
	// session"). The new entries go to the end of their range, as before,
	// so the leaves behind it stay full (839b3ce, which put them first,
	// left them a third to half full). Claim's queries, one state at a
	// time, read the index as they did.
	`DROP INDEX operations_due;
	CREATE INDEX operations_due ON operations (state DESC, next_attempt_at);`,
}

// selectRecord reads a whole record; scanRecord reads its columns. The
// dict values are read with scalar subqueries, each a rowid lookup:
// written as LEFT JOINs the same query measured three times slower.
const selectRecord = `SELECT o.id, o.key, o.scope, o.op_id, o.method, o.url,
	(SELECT value FROM dict WHERE id = o.header), o.body, o.fingerprint, o.state, o.attempts,
	o.next_attempt_at, (SELECT value FROM dict WHERE id = o.lease_owner), o.lease_epoch, o.lease_expires_at,
	o.resp_status, o.resp_header, o.resp_body, o.resp_replayed,
	o.last_error, o.note, o.created_at, o.updated_at, o.expires_at, o.version,
	o.form, (SELECT value FROM dict WHERE id = (o.form >> 2) & 4294967295), o.link
	FROM operations o`

type scanner interface{ Scan(dest ...any) error }

// recordColumns is the number of columns selectRecord reads.
const recordColumns = 28

// scanRecord reads a row of selectRecord. It scans into plain interface
// values and converts them itself: database/sql's conversions into typed
// destinations go through reflection, which for 25 columns costs more than
// SQLite's lookup.
func scanRecord(s scanner) (int64, Record, error) {
	var v [recordColumns]any
	var dest [recordColumns]any
	for i := range v {
		dest[i] = &v[i]
	}
	if err := s.Scan(dest[:]...); err != nil {
		return 0, Record{}, err
	}
	var r Record
	r.Key = keyString(v[1])
	r.Scope, r.ID, r.Method, r.URL = asString(v[2]), asString(v[3]), asString(v[4]), asString(v[5])
	var err error
	if r.Header, err = wire.DecodeHeader(asBytes(v[6])); err != nil {
		return 0, Record{}, fmt.Errorf("%w: header of %s: %v", ErrJournalCorrupt, r.Key, err)
	}
	r.Body = asBytes(v[7])
	r.Fingerprint = fingerprintString(v[8])
	r.State, r.Attempts = State(asInt(v[9])), int(asInt(v[10]))
	r.NextAttemptAt = wire.FromMillis(asInt(v[11]))
	r.Lease = Lease{Owner: asString(v[12]), Epoch: asInt(v[13]), ExpiresAt: wire.FromMillis(asInt(v[14]))}
	if r.State.Terminal() {
		r.Lease.Owner = "" // the settler of a derived history (storeUpdate), not a lease
	}
	if v[15] != nil {
		h, err := wire.DecodeHeader(asBytes(v[16]))
		if err != nil {
			return 0, Record{}, fmt.Errorf("%w: response header of %s: %v", ErrJournalCorrupt, r.Key, err)
		}
		r.Response = &Response{StatusCode: int(asInt(v[15])), Header: h, Body: asBytes(v[17]), Replayed: asInt(v[18]) != 0}
	}
	r.LastError, r.Note = asString(v[19]), asString(v[20])
	r.CreatedAt, r.UpdatedAt, r.ExpiresAt = wire.FromMillis(asInt(v[21])), wire.FromMillis(asInt(v[22])), wire.FromMillis(asInt(v[23]))
	r.Version = asInt(v[24])
	unpackForm(&r, v[25], asString(v[26]))
	r.Link = asString(v[27])
	if len(r.Body) == 0 {
		r.Body = nil
	}
	if r.Response != nil && len(r.Response.Body) == 0 {
		r.Response.Body = nil
	}
	return asInt(v[0]), r, nil
}

// The driver gives int64, []byte (copied by database/sql for an *any
// destination), string or nil.
func asInt(v any) int64 {
	n, _ := v.(int64)
	return n
}

func asString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

func asBytes(v any) []byte {
	switch v := v.(type) {
	case []byte:
		return v
	case string:
		return []byte(v)
	}
	return nil
}

// insertRecord stores a new record (it has no response yet) and returns its
// row id, or 0 when a record with the same scope and ID exists: the
// insert is the existence check, so that creating costs no read.
func (d *dict) insertRecord(tx *sqlitefile.Tx, r Record) (int64, error) {
	header, err := d.intern(tx, wire.EncodeHeader(r.Header))
	if err != nil {
		return 0, err
	}
	owner, err := d.intern(tx, []byte(r.Lease.Owner))
	if err != nil {
		return 0, err
	}
	form, err := d.packForm(tx, r)
	if err != nil {
		return 0, err
	}
	res, err := tx.Exec(`INSERT INTO operations (key, scope, op_id, method, url, header, body, fingerprint,
		state, attempts, next_attempt_at, lease_owner, lease_epoch, lease_expires_at, last_error, note,
		created_at, updated_at, expires_at, version, form, link)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (scope, op_id) DO NOTHING`,
		keyValue(r.Key), r.Scope, r.ID, r.Method, r.URL, header, wire.NonNil(r.Body),
		fingerprintValue(r.Fingerprint), r.State, r.Attempts, wire.Millis(r.NextAttemptAt),
		owner, r.Lease.Epoch, wire.NullMillis(r.Lease.ExpiresAt), nullString(r.LastError),
		nullString(r.Note), wire.Millis(r.CreatedAt), wire.Millis(r.UpdatedAt), wire.NullMillis(r.ExpiresAt), r.Version, form, nullString(r.Link))
	if err != nil {
		return 0, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return 0, err
	}
	return res.LastInsertId()
}

// storeRecord writes the mutable fields of next over the row id, whose
// stored copy is old, and its response when it changed.
func (d *dict) storeRecord(tx *sqlitefile.Tx, id int64, old, next Record) error {
	_, err := d.storeRecordIf(tx, id, old, next, "")
	return err
}

// storeRecordIf is storeRecord with more conditions on the row (a WHERE
// clause to add, and its arguments): it reports whether the row met them
// and was written; when it did not, nothing was.
func (d *dict) storeRecordIf(tx *sqlitefile.Tx, id int64, old, next Record, cond string, args ...any) (bool, error) {
	wrote, err := d.writeRow(tx, id, old, next, "", cond, args...)
	if err != nil || !wrote {
		return false, err
	}
	if old.Version == 1 {
		// The row leaves its first version: write the creation event Create
		// left to be derived. A row created before schema 4 has it already.
		if err := d.insertEventIf(tx, id, journal.CreationEvent(old), true); err != nil {
			return false, err
		}
	}
	return true, nil
}

// storeUpdate writes an Update's record next over the row id, whose stored
// copy is old, with the update's event ev, under storeRecordIf's
// conditions. When the update settles a record at its first version and
// its history is what derivedHistory makes of the settled row (a Do whose
// first attempt was answered), no event is written: the row keeps the
// settler in lease_owner, where a terminal record has no lease, and
// History derives both events from it. Two statements and one b-tree leaf
// fewer in the outcome's commit.
func (d *dict) storeUpdate(tx *sqlitefile.Tx, id int64, old, next Record, ev Event, cond string, args ...any) (bool, error) {
	if old.Version == 1 && next.State.Terminal() {
		if h, ok := derivedHistory(next, ev.Owner); ok && sameEvent(h[0], journal.CreationEvent(old)) && sameEvent(h[1], ev) {
			return d.writeRow(tx, id, old, next, ev.Owner, cond, args...)
		}
	}
	wrote, err := d.storeRecordIf(tx, id, old, next, cond, args...)
	if err != nil || !wrote {
		return false, err
	}
	return true, d.insertEvent(tx, id, ev)
}

// derivedHistory is the history schema 5 leaves unwritten, derived from a
// terminal record at version 2 and the owner its row keeps: created
// in_flight by owner with the attempts it ended with, then answered by
// owner, with no detail, nothing else written in between. ok is false for
// a record that cannot have such a history, which is then in events.
func derivedHistory(rec Record, owner string) (h [2]Event, ok bool) {
	if rec.Version != 2 || !rec.State.Terminal() || rec.State == StateCanceled || owner == "" {
		// Without an owner the row could not tell a derived history from
		// one whose first event a release wrote (ApplyRelease leaves the
		// version as it is): only a settle by its lease holder is derived.
		return h, false
	}
	h[0] = Event{Version: 1, At: rec.CreatedAt, Kind: EventCreate, To: StateInFlight, Attempt: rec.Attempts, Owner: owner}
	h[1] = Event{Version: 2, At: rec.UpdatedAt, Kind: naturalKind(StateInFlight, rec.State), From: StateInFlight,
		To: rec.State, Attempt: rec.Attempts, Error: rec.LastError, Owner: owner}
	if rec.Note != "" {
		h[1].Error = rec.Note
	}
	if rec.Response != nil {
		h[1].StatusCode = rec.Response.StatusCode
	}
	return h, true
}

// sameEvent reports whether a and b read back the same from the journal
// (times at its precision).
func sameEvent(a, b Event) bool {
	return a.Version == b.Version && a.At.UnixMilli() == b.At.UnixMilli() && a.Kind == b.Kind &&
		a.Detail == b.Detail && a.From == b.From && a.To == b.To && a.Attempt == b.Attempt &&
		a.StatusCode == b.StatusCode && a.Error == b.Error && a.Owner == b.Owner
}

// writeRow is the UPDATE of storeRecordIf. keeper, when not empty, is
// stored as the lease owner of a row that next leaves without a lease: the
// owner whose answer derivedHistory reads.
func (d *dict) writeRow(tx *sqlitefile.Tx, id int64, old, next Record, keeper string, cond string, args ...any) (bool, error) {
	leaseOwner := next.Lease.Owner
	if keeper != "" {
		leaseOwner = keeper
	}
	owner, err := d.intern(tx, []byte(leaseOwner))
	if err != nil {
		return false, err
	}
	set := `UPDATE operations SET state = ?, attempts = ?, next_attempt_at = ?, lease_owner = ?,
		lease_epoch = ?, lease_expires_at = ?, last_error = ?, note = ?, updated_at = ?, expires_at = ?,
		version = ?`
	vals := []any{next.State, next.Attempts, wire.Millis(next.NextAttemptAt), owner, next.Lease.Epoch,
		wire.NullMillis(next.Lease.ExpiresAt), nullString(next.LastError), nullString(next.Note),
		wire.Millis(next.UpdatedAt), wire.NullMillis(next.ExpiresAt), next.Version}
	if next.TransportResends != old.TransportResends {
		form, err := d.packForm(tx, next)
		if err != nil {
			return false, err
		}
		set += `, form = ?`
		vals = append(vals, form)
	}
	// The response is written only when it changed: most writes leave it
	// as it is, and need not bind a body again.
	if !sameResponse(old.Response, next.Response) {
		set += `, resp_status = ?, resp_header = ?, resp_body = ?, resp_replayed = ?`
		if resp := next.Response; resp != nil {
			vals = append(vals, resp.StatusCode, wire.EncodeHeader(resp.Header), wire.NonNil(resp.Body), resp.Replayed)
		} else {
			vals = append(vals, nil, nil, nil, nil)
		}
	}
	res, err := tx.Exec(set+` WHERE id = ?`+cond, append(append(vals, id), args...)...)
	if err != nil {
		return false, err
	}
	if cond != "" {
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return false, err
		}
	}
	return true, nil
}

func sameResponse(a, b *Response) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.StatusCode == b.StatusCode && a.Replayed == b.Replayed && string(a.Body) == string(b.Body) &&
		string(wire.EncodeHeader(a.Header)) == string(wire.EncodeHeader(b.Header))
}

// insertEvent appends ev to the history of the row id.
func (d *dict) insertEvent(tx *sqlitefile.Tx, id int64, ev Event) error {
	return d.insertEventIf(tx, id, ev, false)
}

// insertEventIf is insertEvent that, when absent is set, writes nothing if
// the row has an event of ev's version already.
func (d *dict) insertEventIf(tx *sqlitefile.Tx, id int64, ev Event, absent bool) error {
	owner, err := d.intern(tx, []byte(ev.Owner))
	if err != nil {
		return err
	}
	var from, status any
	if ev.From != 0 {
		from = ev.From
	}
	if ev.StatusCode != 0 {
		status = ev.StatusCode
	}
	verb := `INSERT`
	if absent {
		verb = `INSERT OR IGNORE`
	}
	_, err = tx.Exec(verb+` INTO events (op, version, at, from_state, to_state, attempt, status, error, owner,
		why) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		id, ev.Version, wire.Millis(ev.At), from, ev.To, ev.Attempt, status, nullString(ev.Error), owner, packWhy(ev))
	return err
}

// dict numbers the values stored in the dict table. It remembers the
// numbers it has seen so that a write does not look them up again; a
// number learnt in a write that is then rolled back may not exist, so the
// committer makes it forget them all on every rollback, before the next
// write (forget, given to sqlitefile as OnRollback). A committed value
// keeps its number for good: dict rows are never deleted.
type dict struct {
	mu  sync.Mutex
	ids map[string]int64
}

// intern returns the number of value, adding it to dict if need be; an
// empty value is NULL.
func (d *dict) intern(tx *sqlitefile.Tx, value []byte) (any, error) {
	if len(value) == 0 {
		return nil, nil
	}
	d.mu.Lock()
	id, ok := d.ids[string(value)]
	d.mu.Unlock()
	if ok {
		return id, nil
	}
	if _, err := tx.Exec(`INSERT INTO dict (value) VALUES (?) ON CONFLICT (value) DO NOTHING`, value); err != nil {
		return nil, err
	}
	if err := tx.QueryRow(`SELECT id FROM dict WHERE value = ?`, value).Scan(&id); err != nil {
		return nil, err
	}
	d.mu.Lock()
	if d.ids == nil {
		d.ids = map[string]int64{}
	}
	d.ids[string(value)] = id
	d.mu.Unlock()
	return id, nil
}

// forget drops every remembered number.
func (d *dict) forget() {
	d.mu.Lock()
	d.ids = nil
	d.mu.Unlock()
}

// keyValue is how a key is stored and looked up: a canonical UUID as its
// 16 bytes, anything else as text.
func keyValue(k string) any {
	if len(k) == 36 {
		if u, err := uuid.Parse(k); err == nil && u.String() == k {
			return u[:]
		}
	}
	return k
}

func keyString(v any) string {
	switch v := v.(type) {
	case []byte:
		if u, err := uuid.FromBytes(v); err == nil {
			return u.String()
		}
		return string(v)
	case string:
		return v
	}
	return fmt.Sprint(v)
}

// fingerprintValue stores a lowercase hex SHA-256 as its 32 bytes, any other
// fingerprint as text.
func fingerprintValue(f string) any {
	if len(f) == 64 {
		if b, err := hex.DecodeString(f); err == nil && hex.EncodeToString(b) == f {
			return b
		}
	}
	return f
}

func fingerprintString(v any) string {
	switch v := v.(type) {
	case []byte:
		return hex.EncodeToString(v)
	case string:
		return v
	}
	return fmt.Sprint(v)
}

// The operations' form column packs the key's wire form and the
// transport's re-sends: NULL for the default header, bare, and no re-send;
// otherwise bit 0 is "quoted", bit 1 "form not journaled" (the records of
// schema 1, which the migration gives the value 2), bits 2 to 33 the dict
// number of the header name (0 for the default header), and the bits
// above the re-sends.
const (
	formQuoted   = 1
	formUnknown  = 2
	formDictBits = 32
)

func (d *dict) packForm(tx *sqlitefile.Tx, r Record) (any, error) {
	var v int64
	switch r.KeyHeader {
	case "":
		v = formUnknown
	case wire.KeyHeader:
	default:
		id, err := d.intern(tx, []byte(r.KeyHeader))
		if err != nil {
			return nil, err
		}
		v = id.(int64) << 2
	}
	if r.KeyQuoted {
		v |= formQuoted
	}
	v |= int64(r.TransportResends) << (2 + formDictBits)
	if v == 0 {
		return nil, nil
	}
	return v, nil
}

// unpackForm sets r's key form and re-sends from the form column and the
// header name its dict number points to.
func unpackForm(r *Record, form any, header string) {
	v, _ := form.(int64) // nil: the default
	switch {
	case v&formUnknown != 0:
		r.KeyHeader = ""
	case (v>>2)&(1<<formDictBits-1) == 0:
		r.KeyHeader = wire.KeyHeader
	default:
		r.KeyHeader = header
	}
	r.KeyQuoted = v&formQuoted != 0
	r.TransportResends = int(v >> (2 + formDictBits))
}

// The events' why column says why the event happened: NULL when its kind
// is the one its states imply (naturalKind) and it has no detail, which is
// the happy path's case and every event of schema 1; the kind's number when
// it has no detail; "kind:detail" otherwise.
func packWhy(ev Event) any {
	switch {
	case ev.Detail != "":
		return fmt.Sprintf("%d:%s", ev.Kind, ev.Detail)
	case ev.Kind == naturalKind(ev.From, ev.To):
		return nil
	}
	return int64(ev.Kind)
}

func unpackWhy(ev *Event, why any) {
	switch v := why.(type) {
	case nil:
		ev.Kind = naturalKind(ev.From, ev.To)
	case int64:
		ev.Kind = EventKind(v)
	default:
		s := asString(v)
		k, detail, _ := strings.Cut(s, ":")
		n, _ := strconv.Atoi(k)
		ev.Kind, ev.Detail = EventKind(n), detail
	}
}

// naturalKind is the kind an event from one state to another has unless
// said otherwise: creating, or an answer that settles an attempt.
func naturalKind(from, to State) EventKind {
	switch {
	case from == 0:
		return EventCreate
	case (from == StateInFlight || from == StateUnknown) && (to == StateSucceeded || to == StateRejected):
		return EventAnswer
	}
	return EventUpdate
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}
