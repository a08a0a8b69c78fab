package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/server"
)

// Store is a server.Store in PostgreSQL: every replica of an API opens it
// on the same database and schema, and they share one set of keys, so
// that a request retried on another replica finds its key there. Entries
// survive restarts of the replicas and of the database. It is safe for
// concurrent use.
//
// Each operation is atomic on its (scope, key) across every session of the
// database; see the package documentation for the tables, the claim and
// the tokens.
//
// # Group commit
//
// Claims of new keys that arrive together, from any number of goroutines,
// share one INSERT statement, one transaction and one commit; so do
// completions. The first caller to find no batch running sends its own
// write at once, so a lone request waits for nothing; callers that arrive
// while a batch runs go together in the next one. A batch that the server
// refuses as a whole is run again write by write, so that a write it
// refuses fails only its own caller.
//
// # Durability
//
// A claim returns only once it is committed with synchronous_commit on: a
// request is never executed under a claim that a crash of the database
// server could erase. A lock renewal is durable too, because here, unlike
// with an SQLite file, the database can crash while the handler that
// renewed its lock runs on: a lost renewal would make the lock look older
// than the middleware believes, and it could be taken over while its
// handler still runs. Renewals are rare (one per LockTimeout/3 per running
// handler), so this costs nothing that shows.
//
// A completion is durable as well by default, so that a response is in the
// WAL on disk before its first byte is sent: any answer a client could
// have seen is replayable even after the database server crashed. With
// DeferCompletes a completion returns once committed, before its WAL
// flush (synchronous_commit off), which PostgreSQL does within three
// wal_writer_delay (600 ms by default), or sooner with the next durable
// commit of any session. The response is visible to every replica at once;
// a crash of the database server in that window loses it and leaves the
// entry in progress, so once its lock goes stale a retry runs the handler
// again, and only the application's own guard (see server.KeyFromContext)
// keeps that from acting twice: the argument and the price of
// server.SQLiteDeferCompletes. With a synchronous standby, the same holds
// for a fail-over in that window. A crash of a replica loses nothing
// either way.
//
// Releases and sweeps never wait for the flush: losing a release leaves
// the key held until its lock goes stale, which only delays a retry, and
// an expired entry reads as absent whether or not it was swept.
type Store struct {
	pool      *pgxpool.Pool
	schema    string
	clock     *dbClock // the database server's: see the package documentation
	q         storeQueries
	closed    atomic.Bool
	claims    storeGroup[claimWrite]
	completes storeGroup[completeWrite]
}

var _ server.Store = (*Store)(nil)

// MigrateStore creates or migrates the store's tables in schema, and
// nothing else: for teams that run migrations apart from the application.
// Replicas that migrate at once migrate once. It refuses, changing
// nothing, a schema that holds another program's tables of the same names
// (server.ErrNotStore) or a store written by a newer idem
// (server.ErrSchemaTooNew).
func MigrateStore(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if pool == nil {
		return errors.New("postgres: MigrateStore needs a *pgxpool.Pool; open one with pgxpool.New")
	}
	return migrate(ctx, pool, schema, storeKind)
}

// OpenStore returns the key store in pool's database, migrating its tables
// first unless WithoutMigration. It refuses, changing nothing, a
// schema that holds another program's tables (server.ErrNotStore), a
// store written by a newer idem (server.ErrSchemaTooNew), a database that
// refuses writes (ErrReadOnly: a hot standby, or
// default_transaction_read_only on), and, without migration, tables that
// are missing or older (ErrNotMigrated). The
// pool belongs to the application: the store never closes it, and needs
// no connection of its own between calls.
func OpenStore(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	cfg := newOptions(opts)
	if pool == nil {
		return nil, errors.New("postgres: OpenStore needs a *pgxpool.Pool; open one with pgxpool.New")
	}
	if err := cfg.check("OpenStore", cfg.journalOnly, "OpenJournal"); err != nil {
		return nil, err
	}
	if cfg.migrate {
		if err := MigrateStore(ctx, pool, cfg.schema); err != nil {
			return nil, err
		}
	} else {
		v, err := pgschema.Version(ctx, pool, cfg.schema, storeKind)
		if err != nil {
			return nil, err
		}
		if want := len(storeKind.Migrations); v != want {
			return nil, notMigrated("store", cfg.schema, v, want, "MigrateStore")
		}
		// Every claim writes: on a pool that cannot, each request would
		// get a 503 that invites it again.
		if err := pgschema.Writable(ctx, pool, cfg.schema, storeKind.Name); err != nil {
			return nil, err
		}
	}
	if err := readsBytea(ctx, pool, "store", cfg.schema); err != nil {
		return nil, err
	}
	clock := newDBClock()
	if err := clock.refresh(ctx, pool); err != nil {
		return nil, fmt.Errorf("postgres store in schema %q: reading the server's clock: %w", cfg.schema, err)
	}
	s := &Store{pool: pool, schema: cfg.schema, clock: clock, q: newStoreQueries(cfg.schema)}
	s.claims = storeGroup[claimWrite]{max: storeMaxBatch, run: s.insertClaims}
	complete := s.q.complete
	if cfg.deferCompletes {
		complete = s.q.completeDeferred
	}
	s.completes = storeGroup[completeWrite]{max: storeMaxBatch, run: func(ctx context.Context, batch []*completeWrite) {
		s.completeAll(ctx, complete, batch)
	}}
	return s, nil
}

// Schema returns the name of the schema that holds the store.
func (s *Store) Schema() string { return s.schema }

// Close makes later calls fail with server.ErrStoreClosed; calls in
// progress finish. The store owns nothing to release: it runs no goroutine,
// holds a connection only during a call, and leaves nothing unwritten
// behind a call that returned (a deferred completion is committed; only
// its WAL flush is the server's). The pool stays open for the application.
func (s *Store) Close() error {
	s.closed.Store(true)
	return nil
}

// claimRounds bounds how often a claim looks again after the entry in its
// way changed under it (released, replaced, taken over by another
// request). Each round means another session changed the key meanwhile;
// running out takes a storm of them.
const claimRounds = 16

// Claim implements server.Store.
//
// A new key costs one statement, shared with the claims that arrive at the
// same time (see Store). A key that is taken costs a second one, which
// reads the entry in the way; taking an expired entry or a stale lock is a
// third, which locks the row and checks the condition again on its newest
// version, so that of any number of concurrent claims, across replicas,
// exactly one wins.
func (s *Store) Claim(ctx context.Context, req server.ClaimRequest) (server.ClaimResult, error) {
	if err := s.enter(ctx); err != nil {
		return server.ClaimResult{}, err
	}
	if err := onLiveSessionRead(ctx, s.pool, func() error { return s.clock.refresh(ctx, s.pool) }); err != nil {
		return server.ClaimResult{}, s.fail(ctx, "claim", err)
	}
	// The request's times are the caller's clock; the entries' are the
	// server's.
	off := s.clock.off()
	now, expires, stale := storeNanos(req.Now, off), storeNanos(req.ExpiresAt, off), storeNanos(req.StaleBefore, off)
	id := storeID(req.Scope, req.Key)
	// doubted: a write of this claim was in doubt and read back as not
	// committed; behind a transaction pooler it may commit after, and the
	// entry it leaves is then this claim's (claimedAt).
	doubted := false
	for range claimRounds {
		w := claimWrite{req: &req, id: id, now: now, expires: expires}
		if err := s.claims.do(ctx, &w); err != nil {
			return server.ClaimResult{}, s.fail(ctx, "claim", err)
		}
		if w.err != nil {
			return server.ClaimResult{}, s.fail(ctx, "claim", w.err)
		}
		if w.inserted {
			return server.ClaimResult{Claimed: true, Token: w.token, Entry: server.Entry{
				Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint, Method: req.Method, Path: req.Path,
				State: server.InProgress, Token: w.token, CreatedAt: req.Now, LockedAt: req.Now, ExpiresAt: req.ExpiresAt,
			}}, nil
		}
		doubted = doubted || w.doubted
		var e server.Entry
		err := onLiveSessionRead(ctx, s.pool, func() (err error) {
			e, err = scanStoreEntry(s.pool.QueryRow(ctx, s.q.reread, w.id), off)
			return err
		})
		switch {
		case err == nil && doubted && claimedAt(e, off, req.Fingerprint, now):
			// A write of this claim left in doubt (an insert, a
			// replacement, a take-over) committed after its read-back.
			// An insert or a replacement created the entry at the
			// claim's time; a take-over kept its creation.
			return server.ClaimResult{Claimed: true, TookOver: storeNanos(e.CreatedAt, off) != now, Token: e.Token, Entry: e}, nil
		case errors.Is(err, pgx.ErrNoRows):
			// Deleted since the insert ran into it: insert again.
			continue
		case err != nil:
			return server.ClaimResult{}, s.fail(ctx, "claim", err)
		case !e.ExpiresAt.After(req.Now):
			var d bool
			e, d, err = s.claimRow(ctx, &req, id, now, off, s.q.replace,
				id, []byte(req.Fingerprint), []byte(req.Method), []byte(req.Path), now, expires)
			if err == nil {
				return server.ClaimResult{Claimed: true, Token: e.Token, Entry: e}, nil
			}
			doubted = doubted || d
		case e.State == server.InProgress && e.Fingerprint == req.Fingerprint && e.LockedAt.Before(req.StaleBefore):
			var d bool
			e, d, err = s.claimRow(ctx, &req, id, now, off, s.q.takeOver,
				id, []byte(req.Fingerprint), now, expires, stale)
			if err == nil {
				return server.ClaimResult{Claimed: true, TookOver: true, Token: e.Token, Entry: e}, nil
			}
			doubted = doubted || d
		default:
			return server.ClaimResult{Entry: e}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) && !isSerializationFailure(err) {
			return server.ClaimResult{}, s.fail(ctx, "claim", err)
		}
		// Another request replaced, took over, renewed or deleted the
		// entry between the two statements (or while the replacement ran,
		// at a session's default isolation above read committed): look
		// again.
	}
	return server.ClaimResult{}, fmt.Errorf("postgres store in schema %q: claim of a key that changed under it %d times in a row; retry the request",
		s.schema, claimRounds)
}

// claimRow runs a replacement or a take-over of the entry id, which
// returns the entry it claimed, or pgx.ErrNoRows when the entry no longer
// qualified. One whose commit is in doubt is read back: an entry this
// claim's write leaves (claimedAt) is this claim's; any other reads as
// not claimed, and the claim looks again, doubted then true: behind a
// transaction pooler the write may still commit after its read-back, and
// the claim takes the entry it finds then as its own too (see Claim and
// settle). off moves the entry's times back to the caller's clock.
func (s *Store) claimRow(ctx context.Context, req *server.ClaimRequest, id []byte, now int64, off time.Duration, sql string, args ...any) (e server.Entry, doubted bool, err error) {
	err = s.writeTx(ctx, func(b *pgx.Batch) {
		b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
			var err error
			e, err = scanStoreEntry(row, off)
			return err
		})
	})
	d := asDoubt(err)
	if d == nil {
		return e, false, err
	}
	rows, rerr := storeReadBack(ctx, s, d, map[string]bool{string(id): true})
	if rerr != nil {
		return server.Entry{}, false, inDoubt(fmt.Sprintf("the claim of key %q in scope %q", req.Key, req.Scope), d.err, rerr)
	}
	e, ok := rows[string(id)]
	if ok && claimedAt(e, 0, req.Fingerprint, now) {
		return shiftEntry(e, off), false, nil
	}
	return server.Entry{}, true, pgx.ErrNoRows
}

// claimedAt reports whether e, its times moved by off (see
// scanStoreEntry), is what a write of a claim at now (in nanoseconds on
// the server's clock, as sent) with fingerprint fp leaves: an entry in
// progress with that fingerprint, locked at now. It tells a claim's write
// whose commit was in doubt from any other request's, whichever write it
// was: an insert or a replacement creates the entry at now too, a
// take-over keeps the entry's creation.
func claimedAt(e server.Entry, off time.Duration, fp string, now int64) bool {
	return e.State == server.InProgress && e.Fingerprint == fp && storeNanos(e.LockedAt, off) == now
}

// completeRounds bounds how often a completion runs whose commit was in
// doubt and read back as not committed each time: each round means a
// connection to the database broke while it ran.
const completeRounds = 3

// Complete implements server.Store.
func (s *Store) Complete(ctx context.Context, req server.CompleteRequest) error {
	if req.Response == nil {
		return errors.New("postgres store: Complete without a response")
	}
	if err := s.enter(ctx); err != nil {
		return err
	}
	body, header := req.Response.Body, wire.EncodeHeader(req.Response.Header)
	if body == nil {
		body = []byte{}
	}
	var w completeWrite
	for round := 1; ; round++ {
		w = completeWrite{req: &req, id: storeID(req.Scope, req.Key), expires: storeNanos(req.ExpiresAt, s.clock.off()), body: body, header: header}
		if err := s.completes.do(ctx, &w); err != nil {
			return s.fail(ctx, "complete", err)
		}
		if !w.doubted || round == completeRounds {
			break
		}
		// In doubt, read back as not committed: run it again, which
		// waits for the first where that one still runs (see settle).
	}
	switch {
	case w.err != nil:
		return s.fail(ctx, "complete", w.err)
	case !w.done:
		// The same completion again (the first one's reply was lost, or
		// its commit was in doubt and committed after its read-back)
		// finds its own response under its token, and succeeds.
		var same int
		err := onLiveSessionRead(ctx, s.pool, func() error {
			return s.pool.QueryRow(ctx, s.q.completedAlike, w.id, req.Token, int32(req.Response.Status), w.header, w.body).Scan(&same)
		})
		if err != nil {
			return s.fail(ctx, "complete", err)
		}
		if same == 0 {
			return server.ErrLockLost
		}
	}
	return nil
}

// Release implements server.Store.
func (s *Store) Release(ctx context.Context, scope, key string, token int64) error {
	id := storeID(scope, key)
	doubted, err := s.fenced(ctx, "release", s.q.release, id, token, int16(server.InProgress))
	if !doubted || !errors.Is(err, server.ErrLockLost) {
		return err
	}
	// Run again after a commit in doubt, the release found no entry under
	// its token: the first may have deleted it. With no entry at all the
	// key is released, which is what a release is for; under another
	// token, the lock was lost (the first deleted nothing).
	err = onLiveSessionRead(ctx, s.pool, func() error {
		_, err := scanStoreEntry(s.pool.QueryRow(ctx, s.q.reread, id), 0)
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return s.fail(ctx, "release", err)
	}
	return server.ErrLockLost
}

// Renew implements server.Store.
func (s *Store) Renew(ctx context.Context, scope, key string, token int64, now time.Time) error {
	_, err := s.fenced(ctx, "renew", s.q.renew, storeID(scope, key), token, int16(server.InProgress), storeNanos(now, s.clock.off()))
	return err
}

// fenced runs a write that applies only while a token holds an entry's
// lock, and reports server.ErrLockLost when it changed no row. One whose
// commit is in doubt runs again once the first has settled, as the
// journal's renewal does (doubted then true): it changes nothing the first
// did, and behind a transaction pooler, where the first's session cannot
// be waited for (see settle), it waits behind the first for the row. Run
// again, a write that changed no row may find what the first did (a
// release, its entry gone): the caller tells.
func (s *Store) fenced(ctx context.Context, op, sql string, args ...any) (doubted bool, err error) {
	if err := s.enter(ctx); err != nil {
		return false, err
	}
	var n int64
	run := func(ctx context.Context) error {
		return s.writeTx(ctx, func(b *pgx.Batch) {
			b.Queue(sql, args...).Exec(func(tag pgconn.CommandTag) error {
				n = tag.RowsAffected()
				return nil
			})
		})
	}
	err = run(ctx)
	if d := asDoubt(err); d != nil {
		rctx, cancel := readBackCtx(ctx)
		defer cancel()
		if err := settle(rctx, s.pool, d); err != nil {
			return true, s.fail(ctx, op, inDoubt("the "+op+" of an entry's lock", d.err, err))
		}
		// Under the caller's context: a new write, which a caller that
		// stopped waiting (a renewal past its watchdog) does not want.
		doubted, err = true, run(ctx)
	}
	if err != nil {
		return doubted, s.fail(ctx, op, err)
	}
	if n == 0 {
		return doubted, server.ErrLockLost
	}
	return doubted, nil
}

// Get implements server.Store.
func (s *Store) Get(ctx context.Context, scope, key string, now time.Time) (server.Entry, error) {
	if err := s.enter(ctx); err != nil {
		return server.Entry{}, err
	}
	off := s.clock.off()
	var e server.Entry
	err := onLiveSessionRead(ctx, s.pool, func() (err error) {
		e, err = scanStoreEntry(s.pool.QueryRow(ctx, s.q.get, storeID(scope, key), storeNanos(now, off)), off)
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return server.Entry{}, server.ErrNotFound
	}
	if err != nil {
		return server.Entry{}, s.fail(ctx, "get", err)
	}
	return e, nil
}

// storeSweepBatch bounds the rows one sweep statement deletes, so that a
// sweep of a large backlog never holds many row locks, nor a long
// transaction, at once.
const storeSweepBatch = 500

// Sweep implements server.Store.
func (s *Store) Sweep(ctx context.Context, now time.Time) (int, error) {
	if err := s.enter(ctx); err != nil {
		return 0, err
	}
	total := 0
	for {
		var n int
		err := s.writeTx(ctx, func(b *pgx.Batch) {
			b.Queue(s.q.sweep, storeNanos(now, s.clock.off()), storeSweepBatch).Exec(func(tag pgconn.CommandTag) error {
				n = int(tag.RowsAffected())
				return nil
			})
		})
		if err != nil {
			return total, s.fail(ctx, "sweep", err)
		}
		total += n
		if n < storeSweepBatch {
			return total, nil
		}
	}
}

func (s *Store) enter(ctx context.Context) error {
	if s.closed.Load() {
		return server.ErrStoreClosed
	}
	return ctx.Err()
}

// fail wraps a failure of op with the schema, and says what to do when
// the store's tables are gone.
func (s *Store) fail(ctx context.Context, op string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err)) {
		return fmt.Errorf("postgres store in schema %q: %s: %w", s.schema, op, ctxErr)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000") { // undefined_table, invalid_schema_name
		return fmt.Errorf("postgres store in schema %q: %s: %w; the store's tables are gone: run postgres.MigrateStore, or open the store again",
			s.schema, op, err)
	}
	return fmt.Errorf("postgres store in schema %q: %s: %w%s", s.schema, op, asReadOnly(err), timeoutAdvice(err))
}

// scanStoreEntry reads storeColumns, its times moved back from the
// server's clock by off.
func scanStoreEntry(row pgx.Row, off time.Duration) (server.Entry, error) {
	var (
		e                            server.Entry
		scope, key, fp, method, path []byte
		state                        int16
		created, locked, expires     int64
		status                       *int32
		header, body                 []byte
	)
	if err := row.Scan(&scope, &key, &fp, &method, &path, &state, &e.Token,
		&created, &locked, &expires, &status, &header, &body); err != nil {
		return server.Entry{}, err
	}
	e.Scope, e.Key, e.Fingerprint, e.Method, e.Path = string(scope), string(key), string(fp), string(method), string(path)
	e.State = server.EntryState(state)
	e.CreatedAt, e.LockedAt, e.ExpiresAt = storeTime(created, off), storeTime(locked, off), storeTime(expires, off)
	if status != nil {
		r := &server.StoredResponse{Status: int(*status), Body: body}
		if r.Body == nil {
			r.Body = []byte{}
		}
		var err error
		if r.Header, err = wire.DecodeHeader(header); err != nil {
			return server.Entry{}, fmt.Errorf("stored response header of key %q does not parse: %w", e.Key, err)
		}
		e.Response = r
	}
	return e, nil
}

// shiftEntry moves the times of an entry read on the server's clock (off
// zero) to the caller's, as scanStoreEntry with off would have.
func shiftEntry(e server.Entry, off time.Duration) server.Entry {
	e.CreatedAt, e.LockedAt, e.ExpiresAt = e.CreatedAt.Add(-off), e.LockedAt.Add(-off), e.ExpiresAt.Add(-off)
	return e
}

// storeNanos is a caller's time t as the store keeps it: on the server's
// clock (off: server minus caller), in nanoseconds since the epoch.
func storeNanos(t time.Time, off time.Duration) int64 { return t.Add(off).UnixNano() }

// storeTime is storeNanos's inverse.
func storeTime(n int64, off time.Duration) time.Time { return time.Unix(0, n).Add(-off) }
