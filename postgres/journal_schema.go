package postgres

import (
	"github.com/idemkit/idem/postgres/internal/pgschema"
)

// journalKind is the journal's tables, migrated in the application's
// schema. Times are milliseconds since the Unix epoch, the precision every
// journal keeps. An operation and its response share a row: PostgreSQL
// rewrites a row on update anyway (MVCC), so a table of its own would only
// add a write. Claim finds due operations through a partial index on the
// active states, which PostgreSQL maintains without the cost SQLite has.
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
}}

// recordColumns are the columns scanRecord reads, in its order.
const recordColumns = `id, key, scope, op_id, method, url, header, body, fingerprint, key_header, key_quoted,
	resends, state, attempts, next_attempt_at, lease_owner, lease_epoch, lease_expires_at,
	resp_status, resp_header, resp_body, resp_replayed, last_error, note, created_at, updated_at, expires_at, version, link`
