package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/server"
)

// storeMaxBatch bounds the writes one statement carries.
const storeMaxBatch = 128

// claimWrite is one claim's insert in a batch.
type claimWrite struct {
	req      *server.ClaimRequest
	id       []byte // storeID of the request's scope and key
	now      int64  // req.Now and req.ExpiresAt on the server's clock
	expires  int64
	inserted bool
	token    int64
	// doubted: the insert was in doubt and its read-back found nothing.
	// Behind a transaction pooler that may be an insert still running on
	// a server session the store cannot wait for (see settle), whose row
	// then appears: the claim takes such a row as its own (see Claim).
	doubted bool
	err     error
}

// completeWrite is one completion in a batch.
type completeWrite struct {
	req     *server.CompleteRequest
	id      []byte // storeID of the request's scope and key
	expires int64  // req.ExpiresAt on the server's clock
	body    []byte
	header  []byte
	done    bool // the token held the lock, and the response is stored
	// doubted: the completion was in doubt and read back as not
	// committed (err says so). Behind a transaction pooler it may still
	// commit (see settle): Complete runs it again, which waits for one
	// still running and then finds its response stored.
	doubted bool
	err     error
}

// insertClaims inserts the new keys of a batch of claims in one statement,
// in the order of their scope and key. A claim of a key that another claim
// of the batch also asks for is left out: it would find that one's row.
func (s *Store) insertClaims(ctx context.Context, batch []*claimWrite) {
	slices.SortStableFunc(batch, func(a, b *claimWrite) int {
		return cmp.Or(cmp.Compare(a.req.Scope, b.req.Scope), cmp.Compare(a.req.Key, b.req.Key))
	})
	var (
		ids, scopes, keys, fps, methods, paths [][]byte
		nows, expires                          []int64
		sent                                   = make(map[string]*claimWrite, len(batch))
	)
	for _, w := range batch {
		if sent[string(w.id)] != nil {
			continue
		}
		sent[string(w.id)] = w
		ids, scopes, keys = append(ids, w.id), append(scopes, []byte(w.req.Scope)), append(keys, []byte(w.req.Key))
		fps, methods, paths = append(fps, []byte(w.req.Fingerprint)), append(methods, []byte(w.req.Method)), append(paths, []byte(w.req.Path))
		nows, expires = append(nows, w.now), append(expires, w.expires)
	}
	err := s.writeTx(ctx, func(b *pgx.Batch) {
		b.Queue(s.q.insert, ids, scopes, keys, fps, methods, paths, nows, expires).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var (
					id    []byte
					token int64
				)
				if err := rows.Scan(&id, &token); err != nil {
					return err
				}
				if w := sent[string(id)]; w != nil {
					w.inserted, w.token = true, token
				}
			}
			return rows.Err()
		})
	})
	if d := asDoubt(err); d != nil {
		if s.readBackClaims(ctx, d, sent) == notCommitted {
			// Not run again here: each claim inserts again in its next
			// round, which waits for an insert of its key still running,
			// and takes the row that one leaves as its own.
			for _, w := range sent {
				w.doubted = true
			}
		}
		return
	}
	if err != nil {
		storeRetryAlone(ctx, batch, err, func(w *claimWrite) { w.inserted, w.token = false, 0 },
			s.insertClaims, func(w *claimWrite, err error) { w.err = err })
	}
}

// completeAll stores the responses of a batch of completions in one
// statement. A second completion of the same key in the batch runs on its
// own afterwards, so that each one learns whether its own token held.
func (s *Store) completeAll(ctx context.Context, q string, batch []*completeWrite) {
	// In a steady order too, although two batches never update one row
	// unless a key is completed twice at once.
	slices.SortStableFunc(batch, func(a, b *completeWrite) int {
		return cmp.Or(cmp.Compare(a.req.Scope, b.req.Scope), cmp.Compare(a.req.Key, b.req.Key))
	})
	var (
		sent  = make(map[string]*completeWrite, len(batch))
		again []*completeWrite
	)
	// One statement per entry, sent at once, in one transaction.
	err := s.writeTx(ctx, func(b *pgx.Batch) {
		for _, w := range batch {
			if sent[string(w.id)] != nil {
				again = append(again, w)
				continue
			}
			sent[string(w.id)] = w
			b.Queue(q, w.id, w.req.Token, w.expires, int32(w.req.Response.Status),
				w.header, w.body).Exec(func(tag pgconn.CommandTag) error {
				w.done = tag.RowsAffected() == 1
				return nil
			})
		}
	})
	if d := asDoubt(err); d != nil {
		switch s.readBackCompletes(ctx, d, batch, sent) {
		case unreadable:
			return
		case notCommitted:
			// Not run again here: each completion runs again in
			// Complete, as a claim's insert does in its next round.
			for _, w := range sent {
				w.doubted = true
				w.err = fmt.Errorf("its commit's acknowledgement was lost (%w), and it was not committed", d.err)
			}
		}
		err = nil
	}
	if err != nil {
		storeRetryAlone(ctx, batch, err, func(w *completeWrite) { w.done = false },
			func(ctx context.Context, b []*completeWrite) { s.completeAll(ctx, q, b) },
			func(w *completeWrite, err error) { w.err = err })
		return
	}
	for _, w := range again {
		s.completeAll(ctx, q, []*completeWrite{w})
	}
}

// storeRetryAlone handles a batch whose statement failed, which committed
// none of it: a batch of one gets the error; a larger one runs each write
// on its own, so that a write the server refuses (or a deadlock with
// another program's transaction) fails only its own caller.
func storeRetryAlone[W any](ctx context.Context, batch []*W, err error, reset func(*W), run func(context.Context, []*W), fail func(*W, error)) {
	if len(batch) == 1 {
		fail(batch[0], err)
		return
	}
	for _, w := range batch {
		reset(w)
		run(ctx, []*W{w})
	}
}

// writeTx runs the statements that queue adds to a batch in one
// transaction, begun at read committed and committed in the same round
// trip, on a connection of the store's pool (the function writeTx). An
// error that leaves the commit in doubt comes back as a commitDoubt naming
// the connection's server process.
//
// Read committed, whatever the session's default_transaction_isolation
// (which a role or a database may set to repeatable read or serializable;
// see beginTx): the store's writes are conditions on a row checked as the
// row is locked, and at read committed a write that meets a row another
// session changed waits for it and checks its condition again on the
// newest version, which is what lets one of many concurrent claims win
// and the others find the winner's entry. At a stronger level each of
// those, and a renewal, a release or a completion that meets a claim's
// insert, fails with SQLSTATE 40001 instead: a 503 that invites the
// request again, or a lock the handler loses. The store's reads are
// single statements, which at any level read one snapshot and fail for
// nobody.
//
// A statement that meets a session the server ended for idling runs again
// on another (see endedIdle): nothing of it ran, and queue's callbacks
// were not called.
func (s *Store) writeTx(ctx context.Context, queue func(b *pgx.Batch)) error {
	return onLiveSession(ctx, s.pool, func() error { return writeTx(ctx, s.pool, queue) })
}

// readBackClaims settles a batch of new keys whose insert is in doubt: a
// key whose row is what this claim's insert leaves (claimedAt) is this
// claim's, with the row's token. One found means the statement
// committed, and a key not found was taken by another request: its claim
// reads the entry in its way, as after any insert that ran into a row.
// Unreadable, each claim gets an ErrCommitInDoubt error.
func (s *Store) readBackClaims(ctx context.Context, d *commitDoubt, sent map[string]*claimWrite) readResult {
	rows, err := storeReadBack(ctx, s, d, sent)
	if err != nil {
		for _, w := range sent {
			w.inserted, w.token = false, 0
			w.err = inDoubt(fmt.Sprintf("the claim of key %q in scope %q", w.req.Key, w.req.Scope), d.err, err)
		}
		return unreadable
	}
	res := notCommitted
	for id, w := range sent {
		// Both on the server's clock: the row's times as stored, and the
		// claim's as it sent them.
		e, ok := rows[id]
		w.inserted = ok && claimedAt(e, 0, w.req.Fingerprint, w.now)
		w.token = 0
		if w.inserted {
			w.token, res = e.Token, committed
		}
	}
	return res
}

// readBackCompletes settles a batch of completions whose commit is in
// doubt: an entry completed under this completion's token is this one's.
// One found means the statement committed, and a completion not found
// lost its lock. Unreadable, each gets an ErrCommitInDoubt error.
func (s *Store) readBackCompletes(ctx context.Context, d *commitDoubt, batch []*completeWrite, sent map[string]*completeWrite) readResult {
	rows, err := storeReadBack(ctx, s, d, sent)
	if err != nil {
		for _, w := range batch {
			w.done = false
			w.err = inDoubt(fmt.Sprintf("the completion of key %q in scope %q", w.req.Key, w.req.Scope), d.err, err)
		}
		return unreadable
	}
	res := notCommitted
	for id, w := range sent {
		e, ok := rows[id]
		w.done = ok && e.State == server.Completed && e.Token == w.req.Token
		if w.done {
			res = committed
		}
	}
	return res
}

// storeReadBack waits for the session of a commit in doubt to settle, then
// reads the entries it wrote, by id (storeID, as a string), their times
// left on the server's clock, as written.
func storeReadBack[W any](ctx context.Context, s *Store, d *commitDoubt, ids map[string]W) (map[string]server.Entry, error) {
	ctx, cancel := readBackCtx(ctx)
	defer cancel()
	if err := settle(ctx, s.pool, d); err != nil {
		return nil, err
	}
	// A read: it runs again on another session when its own ended, with
	// a batch of its own (a pgx.Batch keeps what the connection it was
	// sent on prepared) and the entries found afresh.
	var out map[string]server.Entry
	err := onLiveSessionRead(ctx, s.pool, func() error {
		out = make(map[string]server.Entry, len(ids))
		b := &pgx.Batch{}
		for id := range ids {
			b.Queue(s.q.reread, []byte(id)).QueryRow(func(row pgx.Row) error {
				e, err := scanStoreEntry(row, 0)
				if errors.Is(err, pgx.ErrNoRows) {
					return nil
				}
				if err == nil {
					out[id] = e
				}
				return err
			})
		}
		return s.pool.SendBatch(ctx, b).Close()
	})
	return out, err
}
