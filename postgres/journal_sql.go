package postgres

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/postgres/internal/pgschema"
)

// queries are the journal's statements, with its schema's name in them.
type queries struct {
	schema     string
	operations string
	events     string
	due        string

	byKey, byOp       string
	lockByKeys        string
	lockByOps         string
	insert, store     string
	insertMany        string
	insertOne         [3]string    // by level
	storeFenced       [3][3]string // by dueChange, then level
	storeFencedFirst  [3][3]string // from version 1: see storeFenced
	writeHeld         string
	dueDelete         string
	dueMove           string
	insertEvent       string
	storeLease        string
	goneOwners        string
	claim             string
	register          string
	registered        string // the owner's row a register sent: see registerAgain
	judge, newSession string
	insertUp          string
	endOwner, sweep   string
	renew             string
}

func newQueries(schema string) queries {
	s := pgschema.Ident(schema)
	q := queries{schema: schema, operations: s + ".operations", events: s + ".events", due: s + ".due"}
	// One lease, found by its key (the unique index; see lockByKeys), and
	// renewed only under its owner and epoch.
	q.renew = `UPDATE ` + q.operations + ` SET lease_expires_at = greatest(lease_expires_at, $4)
		WHERE key = $1 AND lease_epoch = $2 AND lease_owner = $3 AND state IN (1, 2, 3)`
	q.byKey = `SELECT ` + recordColumns + ` FROM ` + q.operations + ` WHERE key = $1`
	q.byOp = `SELECT ` + recordColumns + ` FROM ` + q.operations + ` WHERE scope = $1 AND op_id = $2`
	// Rows are locked one at a time, in the order of the arrays, which
	// every batch of every process sorts (keys; scopes and op_ids by
	// scope, then op_id), so that two batches never wait for each other in
	// a circle. Each row is found by a subquery of its own, by equality on
	// a unique index, which the server looks up in the index even on an
	// empty, unanalyzed table. The plain forms, key = ANY($1) and
	// (scope, op_id) IN (SELECT * FROM unnest(...)), leave the plan to the
	// server, and the generic plan it makes while the table is small (a
	// new journal, before autovacuum has analyzed it) scans the whole
	// table, and goes on doing so as it grows: 4 ms a batch at 20,000
	// rows.
	q.lockByKeys = `SELECT r.* FROM unnest($1::text[]) AS w(key) CROSS JOIN LATERAL (
		SELECT ` + recordColumns + ` FROM ` + q.operations + ` o WHERE o.key = w.key FOR UPDATE) r`
	q.lockByOps = `SELECT r.* FROM unnest($1::text[], $2::text[]) AS w(scope, op_id) CROSS JOIN LATERAL (
		SELECT ` + recordColumns + ` FROM ` + q.operations + ` o WHERE o.scope = w.scope AND o.op_id = w.op_id FOR UPDATE) r`
	// The operation and its creation event in one statement: the event
	// needs the operation's id, which only the insert knows. When another
	// process created the same (scope, op_id) meanwhile, neither is
	// inserted, and the command tag says so.
	q.insert = `WITH ins AS (
		INSERT INTO ` + q.operations + ` (key, scope, op_id, method, url, header, body, fingerprint, key_header, key_quoted,
			resends, state, attempts, next_attempt_at, lease_owner, lease_epoch, lease_expires_at, last_error, note,
			created_at, updated_at, expires_at, version, link)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $26)
		ON CONFLICT (scope, op_id) DO NOTHING RETURNING id, next_attempt_at),
	d AS (INSERT INTO ` + q.due + ` (id, next_attempt_at) SELECT id, next_attempt_at FROM ins)
		INSERT INTO ` + q.events + ` (op, version, at, kind, detail, from_state, to_state, attempt, status, error, owner)
		SELECT id, $23, $21, $24, $25, NULL, $12, $13, NULL, $18, $15 FROM ins`
	// The creates of a batch whose writes this journal made last (see
	// Journal.fastBatch): every operation in one statement, each array
	// holding a column, its creation event in the row (the ev_ columns,
	// see journalKind's migration 5), with the fields insert gives it. A
	// row that would break any unique constraint (the operation, or its
	// key, exists already) is not inserted, and not returned: that create
	// runs again, alone, through the read. Nothing is looked up but the
	// unique indexes, by the inserts.
	q.insertMany = `WITH v AS (
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::bytea[],
			$8::text[], $9::text[], $10::boolean[], $11::integer[], $12::smallint[], $13::integer[], $14::bigint[],
			$15::text[], $16::bigint[], $17::bigint[], $18::text[], $19::text[], $20::bigint[], $21::bigint[],
			$22::bigint[], $23::bigint[], $24::smallint[], $25::text[], $26::text[])
		AS v(key, scope, op_id, method, url, header, body, fingerprint, key_header, key_quoted, resends, state,
			attempts, next_attempt_at, lease_owner, lease_epoch, lease_expires_at, last_error, note, created_at,
			updated_at, expires_at, version, ev_kind, ev_detail, link)
	), ins AS (
		INSERT INTO ` + q.operations + ` (key, scope, op_id, method, url, header, body, fingerprint, key_header, key_quoted,
			resends, state, attempts, next_attempt_at, lease_owner, lease_epoch, lease_expires_at, last_error, note,
			created_at, updated_at, expires_at, version, link, ev_at, ev_kind, ev_detail, ev_error, ev_owner)
		SELECT key, scope, op_id, method, url, header, body, fingerprint, key_header, key_quoted,
			resends, state, attempts, next_attempt_at, lease_owner, lease_epoch, lease_expires_at, last_error, note,
			created_at, updated_at, expires_at, version, link, updated_at, ev_kind, ev_detail, last_error, lease_owner FROM v
		ON CONFLICT DO NOTHING RETURNING id, key, next_attempt_at
	), d AS (
		INSERT INTO ` + q.due + ` (id, next_attempt_at) SELECT id, next_attempt_at FROM ins
	)
	SELECT id, key FROM ins`
	// The create of a batch of one write (see Journal.fastBatch, at one
	// caller the batch of every Create): insertMany for one row, its
	// parameters scalars, which pgx encodes for a fraction of what 26
	// arrays of one element cost, returning the row's id and the
	// transaction's id (txid_current(), for the journal's copy of the row)
	// in place of a statement of its own. Its creation event, in the row.
	// Alone in its transaction, it sets the commit level itself (level).
	// Its one arbiter is (scope, op_id), as insert's: without one, every
	// unique index is an arbiter, and the server looks the new row up in
	// each (the primary key and key too) before inserting it, then again
	// as it inserts. A key taken by another operation fails the statement
	// (unique violation), and the create runs again through the read
	// (Journal.fastBatch), which tells that from the same operation
	// inserted meanwhile.
	for l := range q.insertOne {
		q.insertOne[l] = `WITH ins AS (
		INSERT INTO ` + q.operations + ` (key, scope, op_id, method, url, header, body, fingerprint, key_header, key_quoted,
			resends, state, attempts, next_attempt_at, lease_owner, lease_epoch, lease_expires_at, last_error, note,
			created_at, updated_at, expires_at, version, link, ev_at, ev_kind, ev_detail, ev_error, ev_owner)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $26,
			$21, $24, $25, $18, $15)
		ON CONFLICT (scope, op_id) DO NOTHING RETURNING id, next_attempt_at
	), d AS (
		INSERT INTO ` + q.due + ` (id, next_attempt_at) SELECT id, next_attempt_at FROM ins
	)
	SELECT id, txid_current() FROM ins` + level(l).from()
	}
	// An update of a row this journal wrote last, with its event: found by
	// its primary key, and written only if its xmin is still the
	// transaction that wrote it then ($18), that is if nobody changed it
	// since (see Journal.fastBatch), and it is still the operation ($25)
	// at the version ($26) the journal wrote. Ids and transaction ids are
	// handed out again after a fail-over to an asynchronous standby (and a
	// crash that loses commits): a row the journal wrote and the fail-over
	// lost may have both in another operation's row, which xmin alone
	// would take for the journal's own. It returns the transaction's id
	// (for the journal's copy of the row) when it wrote the row, nothing
	// when the row had changed, and nothing was written. The row's entry in
	// due changes with it, if it does (dueChange). Its event stays in the
	// row ($19-$24: its time, kind, detail, from-state, error and owner;
	// the rest is the row's, as journal.ApplyUpdate makes it), and the
	// event the row held, of the version it leaves, goes to events. Alone
	// in its transaction, it sets the commit level itself (level).
	//
	// A row at version 1 holds its creation event, when a write without a
	// read created it (insertOne, insertMany): the write that moves it past
	// (first, storeFencedFirst) keeps that event in the row, in the cr_
	// columns (see journalKind's migration 8), copied from the ev_ columns
	// by the UPDATE itself, which reads no row before and writes none into
	// events. A Do that goes right writes no event row.
	for first, sf := range [...]*[3][3]string{&q.storeFenced, &q.storeFencedFirst} {
		for c, due := range [...]string{
			dueKeep:   ``,
			dueDelete: `, d AS (DELETE FROM ` + q.due + ` WHERE next_attempt_at = $27 AND id = $1 AND EXISTS (SELECT FROM u))`,
			dueMove: `, d AS (UPDATE ` + q.due + ` SET next_attempt_at = $5
			WHERE next_attempt_at = $27 AND id = $1 AND EXISTS (SELECT FROM u))`,
		} {
			set := `UPDATE ` + q.operations + ` SET state = $2, attempts = $3, resends = $4, next_attempt_at = $5,
			lease_owner = $6, lease_epoch = $7, lease_expires_at = $8, resp_status = $9, resp_header = $10,
			resp_body = $11, resp_replayed = $12, last_error = $13, note = $14, updated_at = $15, expires_at = $16,
			version = $17, ev_at = $19, ev_kind = $20, ev_detail = $21, ev_from = $22, ev_error = $23, ev_owner = $24`
			fence := `
		WHERE id = $1 AND xmin = $18::xid AND key = $25 AND version = $26 RETURNING id)`
			for l := range sf[c] {
				if first == 1 {
					sf[c][l] = `WITH u AS (
		` + set + `,
			` + keptCreation + fence + due + `
	SELECT txid_current() FROM u` + level(l).from()
					continue
				}
				sf[c][l] = `WITH old AS (
		SELECT ` + heldEvent + ` FROM ` + q.operations + `
		WHERE id = $1 AND xmin = $18::xid AND key = $25 AND version = $26 AND ev_kind IS NOT NULL
	), u AS (
		` + set + fence + due + `,
	w AS (
		INSERT INTO ` + q.events + ` (` + eventColumns + `) SELECT * FROM old WHERE EXISTS (SELECT FROM u)
	)
	SELECT txid_current() FROM u` + level(l).from()
			}
		}
	}
	// The event a row holds, written into events before a write that
	// writes its own there (store, after a read under a lock).
	q.writeHeld = `INSERT INTO ` + q.events + ` (` + eventColumns + `)
		SELECT ` + heldEvent + ` FROM ` + q.operations + ` WHERE id = $1 AND ev_kind IS NOT NULL`
	// due's key is (next_attempt_at, id), its only index: the row of an
	// operation is found by the time it was due at, which every writer
	// knows, having read the row under a lock or holding a copy fenced by
	// its xmin and version ($27 of storeFenced, $2 here).
	q.dueDelete = `DELETE FROM ` + q.due + ` WHERE next_attempt_at = $2 AND id = $1`
	q.dueMove = `UPDATE ` + q.due + ` SET next_attempt_at = $3 WHERE next_attempt_at = $2 AND id = $1`
	q.store = `UPDATE ` + q.operations + ` SET state = $2, attempts = $3, resends = $4, next_attempt_at = $5,
		lease_owner = $6, lease_epoch = $7, lease_expires_at = $8, resp_status = $9, resp_header = $10,
		resp_body = $11, resp_replayed = $12, last_error = $13, note = $14, updated_at = $15, expires_at = $16,
		version = $17, ev_kind = NULL WHERE id = $1`
	q.storeLease = `UPDATE ` + q.operations + ` SET lease_owner = $2, lease_epoch = $3, lease_expires_at = $4,
		updated_at = $5 WHERE id = $1`
	q.insertEvent = `INSERT INTO ` + q.events + ` (op, version, at, kind, detail, from_state, to_state, attempt, status, error, owner)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`
	// Due operations in due's order, each operation then found by its
	// primary key and locked, until the limit is reached: a plain join
	// leaves the plan to the server, whose generic plan on a new journal's
	// empty tables scans operations (see lockByKeys). The operation's own
	// state and time decide: a row of due that a settle deletes meanwhile
	// may still be seen, but the operation's new version is not active.
	q.claim = `SELECT r.* FROM (SELECT id FROM ` + q.due + ` WHERE next_attempt_at <= $1 ORDER BY next_attempt_at, id) d
		CROSS JOIN LATERAL (SELECT ` + recordColumns + ` FROM ` + q.operations + ` o
			WHERE o.id = d.id AND state IN (1, 2, 3) AND next_attempt_at <= $1
			AND (lease_owner IS NULL OR lease_expires_at <= $2 OR lease_owner = ANY($3))
			AND ($4 = '' OR scope = $4) AND ($5 = '' OR starts_with(url, $5)) FOR UPDATE SKIP LOCKED) r
		LIMIT $6`
	// The same walk (OFFSET 0 keeps the server from flattening it into a
	// join it would plan as it likes).
	q.goneOwners = `SELECT DISTINCT r.lease_owner FROM (SELECT id FROM ` + q.due + ` WHERE next_attempt_at <= $1 OFFSET 0) d
		CROSS JOIN LATERAL (SELECT lease_owner FROM ` + q.operations + ` o WHERE o.id = d.id AND state IN (1, 2, 3)
			AND next_attempt_at <= $1 AND lease_owner IS NOT NULL AND lease_expires_at > $2 OFFSET 0) r`
	q.register = `INSERT INTO ` + s + `.owners (name, registered_at) VALUES ($1, $2) RETURNING id`
	q.registered = `SELECT id FROM ` + s + `.owners WHERE name = $1 AND registered_at = $2`
	q.ownerQueries(s)
	return q
}

// queueInsert queues the insert of a new record with its creation event.
func (q queries) queueInsert(b *pgx.Batch, r idem.Record, ev idem.Event) *pgx.QueuedQuery {
	return b.Queue(q.insert, insertArgs(r, ev)...)
}

// insertArgs are the parameters of insert and insertOne.
func insertArgs(r idem.Record, ev idem.Event) []any {
	return []any{r.Key, r.Scope, r.ID, r.Method, r.URL, wire.EncodeHeader(r.Header), wire.NonNil(r.Body),
		r.Fingerprint, nullString(r.KeyHeader), r.KeyQuoted, r.TransportResends, int16(r.State), r.Attempts,
		wire.Millis(r.NextAttemptAt), nullString(r.Lease.Owner), r.Lease.Epoch, wire.NullMillis(r.Lease.ExpiresAt),
		nullString(r.LastError), nullString(r.Note), wire.Millis(r.CreatedAt), wire.Millis(r.UpdatedAt), wire.NullMillis(r.ExpiresAt),
		r.Version, int16(ev.Kind), nullString(ev.Detail), nullString(r.Link)}
}

// keptCreation is the SET clause that keeps a row's creation event, held
// in its ev_ columns at version 1, in its cr_ columns: a row created by a
// read (insert), whose creation event is in events, holds none (ev_kind
// NULL), and keeps none.
const keptCreation = `cr_at = ev_at, cr_kind = ev_kind, cr_detail = ev_detail, cr_from = ev_from, cr_state = state,
			cr_attempt = attempts, cr_error = ev_error, cr_owner = ev_owner`

// keptColumns are the creation event a row keeps (cr_kind set), in the
// order of eventColumns after op and version, status left out (a new
// record has no response).
const keptColumns = `cr_at, cr_kind, cr_detail, cr_from, cr_state, cr_attempt, NULL::integer, cr_error, cr_owner`

// eventColumns are the columns of events, in eventArgs' order after op.
const eventColumns = `op, version, at, kind, detail, from_state, to_state, attempt, status, error, owner`

// heldEvent is the event a row of operations holds (ev_kind set), in the
// order of eventColumns.
const heldEvent = `id, version, ev_at, ev_kind, ev_detail, ev_from, state, attempts, resp_status, ev_error, ev_owner`

// insertOneStmt is insertOne of r with its creation event ev, at level l.
func (q queries) insertOneStmt(r idem.Record, ev idem.Event, l level) (string, []any) {
	return q.insertOne[l], insertArgs(r, ev)
}

// queueStore queues the write of r's mutable fields over the row id, which
// holds old, and the change of its entry in due. The event the row holds
// goes to events first: the caller writes the new one there (queueEvent).
func (q queries) queueStore(b *pgx.Batch, id int64, old, r idem.Record) {
	b.Queue(q.writeHeld, id)
	b.Queue(q.store, append([]any{id}, storeArgs(r)...)...)
	switch dueChangeOf(old, r) {
	case dueDelete:
		b.Queue(q.dueDelete, id, wire.Millis(old.NextAttemptAt))
	case dueMove:
		b.Queue(q.dueMove, id, wire.Millis(old.NextAttemptAt), wire.Millis(r.NextAttemptAt))
	}
}

// dueChange is what a write does to its operation's row in due, which
// holds a row for each active operation.
type dueChange uint8

const (
	dueKeep   dueChange = iota // inactive before and after, or due at the same time
	dueDelete                  // the operation leaves the active states
	dueMove                    // active, due at another time
)

// dueChangeOf is the change of due of a write from old to next. An
// operation that has left the active states never returns to them (see
// State.CanMoveTo).
func dueChangeOf(old, next idem.Record) dueChange {
	switch {
	case !old.State.Active():
		return dueKeep
	case !next.State.Active():
		return dueDelete
	case wire.Millis(old.NextAttemptAt) != wire.Millis(next.NextAttemptAt):
		return dueMove
	}
	return dueKeep
}

// storeArgs are the parameters $2 to $17 of store and storeFenced.
func storeArgs(r idem.Record) []any { return appendStoreArgs(nil, r) }

// appendStoreArgs appends storeArgs(r) to args.
func appendStoreArgs(args []any, r idem.Record) []any {
	var status, replayed any
	var header, body []byte
	if resp := r.Response; resp != nil {
		status, replayed, header, body = resp.StatusCode, resp.Replayed, wire.EncodeHeader(resp.Header), wire.NonNil(resp.Body)
	}
	return append(args, int16(r.State), r.Attempts, r.TransportResends, wire.Millis(r.NextAttemptAt),
		nullString(r.Lease.Owner), r.Lease.Epoch, wire.NullMillis(r.Lease.ExpiresAt), status, header, body, replayed,
		nullString(r.LastError), nullString(r.Note), wire.Millis(r.UpdatedAt), wire.NullMillis(r.ExpiresAt), r.Version)
}

// storeFencedStmt is the write of r's mutable fields over the row of copy,
// with its event ev, if the row is still the one copy holds, at level l.
func (q queries) storeFencedStmt(copy rowCopy, r idem.Record, ev idem.Event, l level) (string, []any) {
	// One slice of all 27 parameters, made once.
	args := append(make([]any, 0, 27), copy.id)
	args = appendStoreArgs(args, r)
	args = append(args, copy.xmin)
	args = appendHeldArgs(args, ev)
	args = append(args, copy.rec.Key, copy.rec.Version)
	change := dueChangeOf(copy.rec, r)
	if change != dueKeep {
		args = append(args, wire.Millis(copy.rec.NextAttemptAt))
	}
	if copy.rec.Version == 1 {
		return q.storeFencedFirst[change][l], args
	}
	return q.storeFenced[change][l], args
}

// createColumns are a batch's creates, a column each, for insertMany.
type createColumns struct {
	key, scope, opID, method, url, fingerprint []string
	header, body                               [][]byte
	keyHeader, leaseOwner, lastError, note     []*string
	evDetail, link                             []*string
	keyQuoted                                  []bool
	resends, attempts                          []int32
	state, evKind                              []int16
	next, epoch, created, updated, version     []int64
	leaseExpires, expires                      []*int64
}

func (c *createColumns) add(r idem.Record, ev idem.Event) {
	c.key, c.scope, c.opID = append(c.key, r.Key), append(c.scope, r.Scope), append(c.opID, r.ID)
	c.method, c.url = append(c.method, r.Method), append(c.url, r.URL)
	c.header, c.body = append(c.header, wire.EncodeHeader(r.Header)), append(c.body, wire.NonNil(r.Body))
	c.fingerprint, c.keyHeader = append(c.fingerprint, r.Fingerprint), append(c.keyHeader, nullPtr(r.KeyHeader))
	c.keyQuoted, c.resends = append(c.keyQuoted, r.KeyQuoted), append(c.resends, int32(r.TransportResends))
	c.state, c.attempts = append(c.state, int16(r.State)), append(c.attempts, int32(r.Attempts))
	c.next, c.leaseOwner = append(c.next, wire.Millis(r.NextAttemptAt)), append(c.leaseOwner, nullPtr(r.Lease.Owner))
	c.epoch, c.leaseExpires = append(c.epoch, r.Lease.Epoch), append(c.leaseExpires, nullMillisPtr(r.Lease.ExpiresAt))
	c.lastError, c.note = append(c.lastError, nullPtr(r.LastError)), append(c.note, nullPtr(r.Note))
	c.created, c.updated = append(c.created, wire.Millis(r.CreatedAt)), append(c.updated, wire.Millis(r.UpdatedAt))
	c.expires, c.version = append(c.expires, nullMillisPtr(r.ExpiresAt)), append(c.version, r.Version)
	c.evKind, c.evDetail = append(c.evKind, int16(ev.Kind)), append(c.evDetail, nullPtr(ev.Detail))
	c.link = append(c.link, nullPtr(r.Link))
}

// insertManyStmt is the insert of the creates in c, which returns the id
// and key of each row it inserted.
func (q queries) insertManyStmt(c *createColumns) (string, []any) {
	return q.insertMany, []any{c.key, c.scope, c.opID, c.method, c.url, c.header, c.body, c.fingerprint,
		c.keyHeader, c.keyQuoted, c.resends, c.state, c.attempts, c.next, c.leaseOwner, c.epoch, c.leaseExpires,
		c.lastError, c.note, c.created, c.updated, c.expires, c.version, c.evKind, c.evDetail, c.link}
}

// queueLease queues the write of r's lease alone (Release: no event).
func (q queries) queueLease(b *pgx.Batch, id int64, r idem.Record) {
	b.Queue(q.storeLease, id, nullString(r.Lease.Owner), r.Lease.Epoch, wire.NullMillis(r.Lease.ExpiresAt), wire.Millis(r.UpdatedAt))
}

// queueEvent queues the insert of an event of the row id.
func (q queries) queueEvent(b *pgx.Batch, id int64, ev idem.Event) {
	b.Queue(q.insertEvent, append([]any{id}, eventArgs(ev)...)...)
}

// eventArgs are an event's columns after op, in insertEvent's order.
func eventArgs(ev idem.Event) []any {
	var from, status any
	if ev.From != 0 {
		from = int16(ev.From)
	}
	if ev.StatusCode != 0 {
		status = ev.StatusCode
	}
	return []any{ev.Version, wire.Millis(ev.At), int16(ev.Kind), nullString(ev.Detail), from, int16(ev.To),
		ev.Attempt, status, nullString(ev.Error), nullString(ev.Owner)}
}

// appendHeldArgs appends the columns of ev a row holds (ev_at, ev_kind, ev_detail,
// ev_from, ev_error, ev_owner); its version, state, attempt and status are
// the row's.
func appendHeldArgs(args []any, ev idem.Event) []any {
	var from any
	if ev.From != 0 {
		from = int16(ev.From)
	}
	return append(args, wire.Millis(ev.At), int16(ev.Kind), nullString(ev.Detail), from, nullString(ev.Error), nullString(ev.Owner))
}

// scanRecord reads a row of recordColumns.
func scanRecord(row pgx.Row) (int64, idem.Record, error) {
	var (
		r                               idem.Record
		id                              int64
		header, body                    []byte
		keyHeader, owner, lastErr, note *string
		link                            *string
		keyQuoted                       bool
		resends, attempts               int32
		state                           int16
		next, epoch                     int64
		leaseExp, expires               *int64
		respStatus                      *int32
		respHeader, respBody            []byte
		respReplayed                    *bool
		created, updated, version       int64
	)
	err := row.Scan(&id, &r.Key, &r.Scope, &r.ID, &r.Method, &r.URL, &header, &body, &r.Fingerprint, &keyHeader,
		&keyQuoted, &resends, &state, &attempts, &next, &owner, &epoch, &leaseExp, &respStatus, &respHeader,
		&respBody, &respReplayed, &lastErr, &note, &created, &updated, &expires, &version, &link)
	if err != nil {
		return 0, idem.Record{}, err
	}
	if r.Header, err = wire.DecodeHeader(header); err != nil {
		return 0, idem.Record{}, fmt.Errorf("header of %s: %w", r.Key, err)
	}
	if len(body) > 0 {
		r.Body = body
	}
	r.KeyHeader, r.KeyQuoted, r.TransportResends = deref(keyHeader), keyQuoted, int(resends)
	r.State, r.Attempts, r.NextAttemptAt = idem.State(state), int(attempts), wire.FromMillis(next)
	r.Lease = idem.Lease{Owner: deref(owner), Epoch: epoch}
	if leaseExp != nil {
		r.Lease.ExpiresAt = wire.FromMillis(*leaseExp)
	}
	if respStatus != nil {
		h, err := wire.DecodeHeader(respHeader)
		if err != nil {
			return 0, idem.Record{}, fmt.Errorf("response header of %s: %w", r.Key, err)
		}
		r.Response = &idem.Response{StatusCode: int(*respStatus), Header: h, Replayed: respReplayed != nil && *respReplayed}
		if len(respBody) > 0 {
			r.Response.Body = respBody
		}
	}
	r.LastError, r.Note, r.Link = deref(lastErr), deref(note), deref(link)
	r.CreatedAt, r.UpdatedAt, r.Version = wire.FromMillis(created), wire.FromMillis(updated), version
	if expires != nil {
		r.ExpiresAt = wire.FromMillis(*expires)
	}
	return id, r, nil
}

// isUniqueViolation reports a unique constraint error, and its constraint.
func isUniqueViolation(err error) (string, bool) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" {
		return pe.ConstraintName, true
	}
	return "", false
}

// isSerializationFailure reports PostgreSQL's "could not serialize
// access" (SQLSTATE 40001): a statement that ran at repeatable read or
// serializable, the session's default where a role or database sets it,
// into a row another transaction changed since its snapshot. Rolled back,
// it changed nothing; run again, it takes a new snapshot, as read
// committed would have.
func isSerializationFailure(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "40001"
}

func nullMillisPtr(t time.Time) *int64 {
	if t.IsZero() {
		return nil
	}
	ms := t.UnixMilli()
	return &ms
}

func nullPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}
