package postgres

import (
	"strings"

	"github.com/idemkit/idem/postgres/internal/pgschema"
)

// journalKind is the journal's tables, migrated in the application's
// schema. Times are milliseconds since the Unix epoch, the precision every
// journal keeps. An operation and its response share a row: PostgreSQL
// rewrites a row on update anyway (MVCC), so a table of its own would only
// add a write. Claim finds due operations through the table due, which
// holds the active ones (see migration 5).
var journalKind = pgschema.Kind{Name: "journal", Marker: "operations", Migrations: []string{
	`CREATE TABLE operations (
		id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		key              text NOT NULL UNIQUE,
		scope            text NOT NULL,
		op_id            text NOT NULL,
		method           text NOT NULL,
		url              text NOT NULL,
		header           bytea,
		body             bytea NOT NULL,
		fingerprint      text NOT NULL,
		key_header       text,
		key_quoted       boolean NOT NULL,
		resends          integer NOT NULL,
		state            smallint NOT NULL,
		attempts         integer NOT NULL,
		next_attempt_at  bigint NOT NULL,
		lease_owner      text,
		lease_epoch      bigint NOT NULL,
		lease_expires_at bigint,
		resp_status      integer,
		resp_header      bytea,
		resp_body        bytea,
		resp_replayed    boolean,
		last_error       text,
		note             text,
		created_at       bigint NOT NULL,
		updated_at       bigint NOT NULL,
		expires_at       bigint,
		version          bigint NOT NULL,
		UNIQUE (scope, op_id)
	);
	CREATE INDEX operations_due ON operations (next_attempt_at, id) WHERE state IN (1, 2, 3);
	CREATE TABLE events (
		op         bigint NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
		version    bigint NOT NULL,
		at         bigint NOT NULL,
		kind       smallint NOT NULL,
		detail     text,
		from_state smallint,
		to_state   smallint NOT NULL,
		attempt    integer NOT NULL,
		status     integer,
		error      text,
		owner      text,
		PRIMARY KEY (op, version)
	);
	CREATE TABLE owners (
		id            integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		name          text NOT NULL UNIQUE,
		registered_at bigint NOT NULL
	);
	CREATE TABLE sync (id integer PRIMARY KEY, at bigint NOT NULL);
	INSERT INTO sync VALUES (1, 0);`,
	// 2: events lose their foreign key. Every event is inserted by the
	// statement or the transaction that writes its operation (the id comes
	// from that write, or from a row the transaction holds locked), so the
	// key only checked what is true by construction, at a price: for each
	// event a trigger that looks the operation up and locks it (FOR KEY
	// SHARE, a WAL record of its own), a sixth of the server's time for
	// Do's writes (a batch of 16 creates and 16 updates: 1.9 ms, 1.6 ms
	// without). Prune deletes the events of the operations it deletes (ON
	// DELETE CASCADE did).
	`ALTER TABLE events DROP CONSTRAINT events_op_fkey;`,
	// 3: the link to the trace that created the operation (Record.Link),
	// NULL when the client has no Hooks.Link.
	`ALTER TABLE operations ADD COLUMN link text;`,
	// 4: an owner's liveness is judged afresh every time, and an owner
	// whose session ended while it lives on is not taken for dead (see
	// journal_owners.go): session counts the liveness sessions the owner
	// took, lost_session and lost_at say since when (the database's clock)
	// its lock has been found free in that session, ended_at when it ended
	// its registration.
	`ALTER TABLE owners ADD COLUMN session bigint NOT NULL DEFAULT 0, ADD COLUMN lost_session bigint,
		ADD COLUMN lost_at bigint, ADD COLUMN ended_at bigint;`,
	// 5: the server's timeline when the mark was made (lost_timeline): a
	// mark made before a promotion counts for nothing on the promoted
	// standby, whose timeline is the next (see journal_owners.go). Marks
	// of version 4 have none, and count for nothing: the grace of an
	// owner found without its lock when the journal is migrated starts
	// again at the next judgement.
	`ALTER TABLE owners ADD COLUMN lost_timeline bigint;`,
	// 6: when the journal first found the server up (server_up, one row,
	// the database's clock), which a liveness mark counts from at the
	// earliest (see journal_owners.go). The table is unlogged: PostgreSQL
	// empties it at every crash recovery, a backend's crash included, and
	// a promoted standby has it empty. A promotion is thus covered too, and
	// lost_timeline goes: a mark of version 5 counts from the first
	// judgement after the migration at the earliest.
	`CREATE UNLOGGED TABLE server_up (id integer PRIMARY KEY CHECK (id = 1), at bigint NOT NULL);
	ALTER TABLE owners DROP COLUMN lost_timeline;`,
	// 7: the due queue leaves the operations table's indexes, so that the
	// write that settles an operation is a HOT update. The partial index
	// operations_due read state in its predicate: the settle, which changes
	// state, could never be HOT, and every index of the table (the primary
	// key, key, (scope, op_id)) got an entry for the new row version, three
	// b-tree inserts (two with a uniqueness check) per settle. due holds
	// one row per active operation (states 1, 2, 3), inserted with the
	// operation, moved with its next_attempt_at, deleted when it settles (a
	// heap delete, no index entry). Its one index, the primary key, is
	// (next_attempt_at, id), Claim's order, appended to at its right end as
	// time goes; a writer finds its operation's row by the time the row
	// was due at, which it knows (see queries.dueDelete). The fill factor
	// leaves room on each page of operations for the settled version of
	// the rows inserted there, which a HOT update must find on the same
	// page: at 70, a batch of creates filled pages so that only half the
	// settles at 64 callers found room; at 50, nine in ten do.
	//
	// The ev_ columns hold the event of the row's current version, when
	// ev_kind is set, in place of a row of events: the fields of the event
	// that the row does not hold itself (its version, state, attempts and
	// response status are the row's; its time and owner are kept, a
	// Release changing the row's). The writes that need no read (see
	// Journal.fastBatch) keep their event there, and the write that moves
	// the row past that version writes it into events, in its statement:
	// a Do that goes right writes one event, not two. History and the
	// read-back of a commit in doubt read it from the row.
	`CREATE TABLE due (
		next_attempt_at bigint NOT NULL,
		id              bigint NOT NULL,
		PRIMARY KEY (next_attempt_at, id)
	);
	INSERT INTO due SELECT next_attempt_at, id FROM operations WHERE state IN (1, 2, 3);
	ALTER TABLE operations ADD COLUMN ev_at bigint, ADD COLUMN ev_kind smallint, ADD COLUMN ev_detail text,
		ADD COLUMN ev_from smallint, ADD COLUMN ev_error text, ADD COLUMN ev_owner text;
	DROP INDEX operations_due;
	ALTER TABLE operations SET (fillfactor = 50);`,
	// 8: the creation event of a row that a write without a read created,
	// held in its ev_ columns at version 1, stays in the row when the
	// write without a read that moves it past comes (see
	// queries.storeFencedFirst): the cr_ columns, set from the ev_ ones by
	// that UPDATE, in place of a row of events. A Do that goes right
	// writes no event row (a heap insert, a b-tree insert and a read of
	// the row fewer per Do). History and the read-back of a create in
	// doubt read it from the row; cr_kind NULL: the creation event, if the
	// row has passed version 1, is in events. The data needs no change;
	// the version makes a build of schema 7, which would read such a row
	// without its creation event, refuse the journal.
	`ALTER TABLE operations ADD COLUMN cr_at bigint, ADD COLUMN cr_kind smallint, ADD COLUMN cr_detail text,
		ADD COLUMN cr_from smallint, ADD COLUMN cr_state smallint, ADD COLUMN cr_attempt integer,
		ADD COLUMN cr_error text, ADD COLUMN cr_owner text;`,
}}

// qualifiedColumns is columns, a list of recordColumns' form, each column
// qualified by table.
func qualifiedColumns(table, columns string) string {
	cols := strings.Split(columns, ",")
	for i, c := range cols {
		cols[i] = table + "." + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

// recordColumns are the columns scanRecord reads, in its order.
const recordColumns = `id, key, scope, op_id, method, url, header, body, fingerprint, key_header, key_quoted,
	resends, state, attempts, next_attempt_at, lease_owner, lease_epoch, lease_expires_at,
	resp_status, resp_header, resp_body, resp_replayed, last_error, note, created_at, updated_at, expires_at, version, link`
