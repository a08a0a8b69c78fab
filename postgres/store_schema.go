package postgres

import (
	"crypto/sha256"
	"encoding/binary"
	"strconv"
	"strings"

	"github.com/idemkit/idem/postgres/internal/pgschema"
)

// storeKind is the store's tables, migrated in the application's schema
// beside the journal's (each kind keeps its own version).
//
// Times are nanoseconds since the Unix epoch, as the SQLite store keeps
// them: the middleware fences on them (a lock is stale when LockedAt is
// before StaleBefore, an entry gone when ExpiresAt is not after now), and
// those comparisons must be exact at the precision the callers pass;
// timestamptz would round to microseconds.
//
// Scope, key, fingerprint, method and path are bytes (bytea), kept as the
// middleware passes them: a path may decode to bytes that are not UTF-8
// (/files/caf%E9.txt) or to a NUL, and a scope may be any identity the
// application names, a 3 KB token say; text would refuse the first two
// and a B-tree entry cannot hold the third (at most 2,704 bytes). They are
// compared byte for byte, as opaque identifiers are. A row is found by
// id, the SHA-256 of its scope and key (storeID), which every lookup
// computes: fixed in size whatever their length, and distinct for every
// pair (the scope's length comes first, so that ("ab", "c") and ("a",
// "bc") differ).
//
// Tokens come from one sequence, store_tokens, with no cache, so that a
// token is never handed out twice in the schema, whatever rows are deleted
// (a released key claimed again never gives an old holder its token back),
// and the token a take-over or a replacement draws, under the row's lock,
// is greater than the one it replaces. (A claim that inserts a new row
// draws its token before it inserts: should the key be released and
// claimed again in between, by a quicker request, the token it then
// inserts is older than that one's, and unique all the same. Fencing needs
// uniqueness only.)
//
// A sequence alone is unique in one history of the database only.
// PostgreSQL logs a sequence 32 values ahead of what it hands out, and a
// standby promoted after an asynchronous fail-over starts from the last
// log it received: the values the old primary handed out after that go
// out again. A handler still running on such a token (its key lost with
// the fail-over, and claimed again by a retry) would have its late
// Complete or Release applied to the new holder's lock. So a token
// carries the server's timeline, which every promotion increments, above
// the sequence's value: a token drawn after a promotion is greater than
// any drawn before it, on any server of the old timeline.
//
// Version 2 moved version 1's text columns, keyed by (scope, key), to
// bytes keyed by id; the rows are kept.
var storeKind = pgschema.Kind{Name: "store", Marker: "store_entries", Migrations: []string{
	`CREATE SEQUENCE store_tokens AS bigint CACHE 1;
	CREATE TABLE store_entries (
		scope       text COLLATE "C" NOT NULL,
		key         text COLLATE "C" NOT NULL,
		fingerprint text NOT NULL,
		method      text NOT NULL,
		path        text NOT NULL,
		state       smallint NOT NULL,
		token       bigint NOT NULL,
		created_at  bigint NOT NULL,
		locked_at   bigint NOT NULL,
		expires_at  bigint NOT NULL,
		resp_status integer,
		resp_header bytea,
		resp_body   bytea,
		PRIMARY KEY (scope, key)
	);
	CREATE INDEX store_entries_expiry ON store_entries (expires_at);`,
	`CREATE TABLE store_entries_v2 (
		id          bytea PRIMARY KEY,
		scope       bytea NOT NULL,
		key         bytea NOT NULL,
		fingerprint bytea NOT NULL,
		method      bytea NOT NULL,
		path        bytea NOT NULL,
		state       smallint NOT NULL,
		token       bigint NOT NULL,
		created_at  bigint NOT NULL,
		locked_at   bigint NOT NULL,
		expires_at  bigint NOT NULL,
		resp_status integer,
		resp_header bytea,
		resp_body   bytea
	);
	INSERT INTO store_entries_v2
	SELECT sha256(int4send(octet_length(v.scope)) || v.scope || v.key), v.scope, v.key,
		convert_to(e.fingerprint, 'UTF8'), convert_to(e.method, 'UTF8'), convert_to(e.path, 'UTF8'),
		e.state, e.token, e.created_at, e.locked_at, e.expires_at, e.resp_status, e.resp_header, e.resp_body
	FROM store_entries AS e, LATERAL (SELECT convert_to(e.scope, 'UTF8') AS scope, convert_to(e.key, 'UTF8') AS key) AS v;
	DROP TABLE store_entries;
	ALTER TABLE store_entries_v2 RENAME TO store_entries;
	ALTER TABLE store_entries RENAME CONSTRAINT store_entries_v2_pkey TO store_entries_pkey;
	CREATE INDEX store_entries_expiry ON store_entries (expires_at);`,
}}

// storeID is the id of (scope, key)'s row: SHA-256 of the scope's length
// (4 bytes, big-endian), the scope and the key, as migration 2 computes it
// in SQL.
func storeID(scope, key string) []byte {
	h := sha256.New()
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(scope)))
	h.Write(n[:])
	h.Write([]byte(scope))
	h.Write([]byte(key))
	return h.Sum(nil)
}

// storeColumns are the columns scanStoreEntry reads, in its order.
const storeColumns = `scope, key, fingerprint, method, path, state, token, created_at, locked_at,
	expires_at, resp_status, resp_header, resp_body`

// storeQueries are the store's statements, with the schema's name in them.
type storeQueries struct {
	insert, replace, takeOver, reread string
	complete, completeDeferred        string
	completedAlike                    string
	release, renew, get, sweep        string
}

// storeTokenShift is how far a token's timeline is shifted left: the
// sequence keeps 2^48 values (a million claims a second for 8 years), the
// timeline 15 bits.
const storeTokenShift = 48

// serverTimeline is the server's timeline, which every promotion
// increments: the first eight hex digits of the name of the WAL file it
// writes, which any role may read. It fails on a standby, where nothing
// that reads it runs.
const serverTimeline = `('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint`

func newStoreQueries(schema string) storeQueries {
	table := pgschema.Ident(schema) + ".store_entries"
	// nextval takes the sequence's name as text: quote it as an identifier,
	// then as a string literal.
	tokens := storeLiteral(pgschema.Ident(schema) + ".store_tokens")
	// A token is the server's timeline above the sequence's value (see
	// storeTokenShift).
	token := `((` + serverTimeline + ` << ` + strconv.Itoa(storeTokenShift) + `) | nextval(` + tokens + `))`
	// One completion, its row found by its primary key: a batch sends one
	// per entry, in one transaction. A single UPDATE joined to unnest
	// would leave the way to the rows to the planner, and the generic plan
	// it keeps for a prepared statement, made while a new store's table is
	// empty, scans the whole table, and goes on doing so as it grows.
	complete := func(mode string) string {
		return `UPDATE ` + table + ` AS e SET state = 2, expires_at = $3,
				resp_status = $4, resp_header = $5, resp_body = $6
			FROM (` + mode + `) AS d
			WHERE e.id = $1 AND e.token = $2 AND e.state = 1`
	}
	return storeQueries{
		// New keys, one row per claim of a batch, inserted in the batch's
		// order (sorted by scope and key, so that two batches that share
		// keys lock them in the same order and never deadlock). DO
		// NOTHING neither locks nor writes a row in the way, so a claim
		// that finds its key taken (a replay, a 409) writes nothing.
		insert: `INSERT INTO ` + table + ` (id, scope, key, fingerprint, method, path, state, token, created_at, locked_at, expires_at)
			SELECT v.id, v.scope, v.key, v.fingerprint, v.method, v.path, 1, ` + token + `, v.now, v.now, v.expires_at
			FROM (` + commitDurable + `) AS d,
				unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::bytea[], $5::bytea[], $6::bytea[], $7::bigint[], $8::bigint[])
				WITH ORDINALITY AS v(id, scope, key, fingerprint, method, path, now, expires_at, i)
			ORDER BY v.i
			ON CONFLICT (id) DO NOTHING
			RETURNING id, token`,
		// An expired entry: replaced by a new one, if it is still expired
		// once its row is locked.
		replace: `UPDATE ` + table + ` AS e SET fingerprint = $2, method = $3, path = $4, state = 1,
				token = ` + token + `, created_at = $5, locked_at = $5, expires_at = $6,
				resp_status = NULL, resp_header = NULL, resp_body = NULL
			FROM (` + commitDurable + `) AS d
			WHERE e.id = $1 AND e.expires_at <= $5
			RETURNING ` + storeColumns,
		// A stale lock: taken over with a new token, if it is still stale
		// once its row is locked (PostgreSQL evaluates the condition again
		// on the newest version of a row it waited for, so of many
		// concurrent take-overs one wins).
		takeOver: `UPDATE ` + table + ` AS e SET token = ` + token + `, locked_at = $3,
				expires_at = GREATEST(e.expires_at, $4)
			FROM (` + commitDurable + `) AS d
			WHERE e.id = $1 AND e.state = 1 AND e.fingerprint = $2
				AND e.locked_at < $5 AND e.expires_at > $3
			RETURNING ` + storeColumns,
		reread:           `SELECT ` + storeColumns + ` FROM ` + table + ` WHERE id = $1`,
		complete:         complete(commitDurable),
		completeDeferred: complete(commitDeferred),
		// Whether the entry holds this very completion already (by its
		// primary key, as complete finds it): a completion sent again
		// after its reply was lost.
		completedAlike: `SELECT count(*) FROM ` + table + ` WHERE id = $1 AND token = $2 AND state = 2
			AND resp_status = $3 AND resp_header IS NOT DISTINCT FROM $4 AND resp_body = $5`,
		release: `DELETE FROM ` + table + ` AS e USING (` + commitDeferred + `) AS d
			WHERE e.id = $1 AND e.token = $2 AND e.state = $3`,
		renew: `UPDATE ` + table + ` AS e SET locked_at = $4 FROM (` + commitDurable + `) AS d
			WHERE e.id = $1 AND e.token = $2 AND e.state = $3`,
		get: `SELECT ` + storeColumns + ` FROM ` + table + ` WHERE id = $1 AND expires_at > $2`,
		// One batch of expired entries. SKIP LOCKED passes over the rows a
		// claim is replacing, and lets replicas that sweep at once share
		// the work instead of queueing on each other.
		sweep: `DELETE FROM ` + table + ` AS e USING (` + commitDeferred + `) AS d
			WHERE e.id IN (
				SELECT id FROM ` + table + ` WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED)
			AND e.expires_at <= $1`,
	}
}

// storeLiteral quotes s as an SQL string literal, whatever the server's
// standard_conforming_strings.
func storeLiteral(s string) string {
	if strings.Contains(s, `\`) {
		return `E'` + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), `'`, `''`) + `'`
	}
	return `'` + strings.ReplaceAll(s, `'`, `''`) + `'`
}
