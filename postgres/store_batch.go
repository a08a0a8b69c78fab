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
	inserted bool
	token    int64
	err      error
}

// completeWrite is one completion in a batch.
type completeWrite struct {
	req    *server.CompleteRequest
	body   []byte
	header []byte
	done   bool // the token held the lock, and the response is stored
	err    error
}

type scopedKey struct{ scope, key string }

// insertClaims inserts the new keys of a batch of claims in one statement,
// in the order of their scope and key. A claim of a key that another claim
// of the batch also asks for is left out: it would find that one's row.
func (s *Store) insertClaims(ctx context.Context, batch []*claimWrite) {
	slices.SortStableFunc(batch, func(a, b *claimWrite) int {
		return cmp.Or(cmp.Compare(a.req.Scope, b.req.Scope), cmp.Compare(a.req.Key, b.req.Key))
	})
	var (
		scopes, keys, fps, methods, paths []string
		nows, expires                     []int64
		sent                              = make(map[scopedKey]*claimWrite, len(batch))
	)
	for _, w := range batch {
		k := scopedKey{w.req.Scope, w.req.Key}
		if sent[k] != nil {
			continue
		}
		sent[k] = w
		scopes, keys, fps = append(scopes, w.req.Scope), append(keys, w.req.Key), append(fps, w.req.Fingerprint)
		methods, paths = append(methods, w.req.Method), append(paths, w.req.Path)
		nows, expires = append(nows, storeNanos(w.req.Now)), append(expires, storeNanos(w.req.ExpiresAt))
	}
	err := s.withConn(ctx, func(conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, s.q.insert, scopes, keys, fps, methods, paths, nows, expires)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				k     scopedKey
				token int64
			)
			if err = rows.Scan(&k.scope, &k.key, &token); err != nil {
				return err
			}
			if w := sent[k]; w != nil {
				w.inserted, w.token = true, token
			}
		}
		rows.Close()
		return rows.Err()
	})
	if d := asDoubt(err); d != nil {
		if s.readBackClaims(ctx, d, sent) != notCommitted {
			return
		}
		err = fmt.Errorf("its commit's acknowledgement was lost (%w), and it was not committed", d.err)
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
		sent  = make(map[scopedKey]*completeWrite, len(batch))
		again []*completeWrite
		b     = &pgx.Batch{}
	)
	// One statement per entry, sent at once: pgx runs a batch outside a
	// transaction as one implicit transaction, so they commit together.
	for _, w := range batch {
		k := scopedKey{w.req.Scope, w.req.Key}
		if sent[k] != nil {
			again = append(again, w)
			continue
		}
		sent[k] = w
		b.Queue(q, w.req.Scope, w.req.Key, w.req.Token, storeNanos(w.req.ExpiresAt), int32(w.req.Response.Status),
			w.header, w.body).Exec(func(tag pgconn.CommandTag) error {
			w.done = tag.RowsAffected() == 1
			return nil
		})
	}
	err := s.withConn(ctx, func(conn *pgx.Conn) error { return conn.SendBatch(ctx, b).Close() })
	if d := asDoubt(err); d != nil {
		switch s.readBackCompletes(ctx, d, batch, sent) {
		case unreadable:
			return
		case committed:
			err = nil
		default:
			err = fmt.Errorf("its commit's acknowledgement was lost (%w), and it was not committed", d.err)
		}
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

// withConn runs fn on a connection of the pool: fn's statements carry an
// implicit transaction's commit, and an error that leaves it in doubt
// comes back as a commitDoubt naming the connection's server process.
func (s *Store) withConn(ctx context.Context, fn func(*pgx.Conn) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	return doubtful(conn.Conn(), fn(conn.Conn()))
}

// readBackClaims settles a batch of new keys whose insert is in doubt: a
// key whose row is in progress with this claim's fingerprint, created and
// locked at this claim's time (in nanoseconds), is this claim's, with the
// row's token. One found means the statement committed, and a key not
// found was taken by another request: its claim reads the entry in its
// way, as after any insert that ran into a row. Unreadable, each claim
// gets an ErrCommitInDoubt error.
func (s *Store) readBackClaims(ctx context.Context, d *commitDoubt, sent map[scopedKey]*claimWrite) readResult {
	rows, err := storeReadBack(ctx, s, d, sent)
	if err != nil {
		for k, w := range sent {
			w.inserted, w.token = false, 0
			w.err = inDoubt(fmt.Sprintf("the claim of key %q in scope %q", k.key, k.scope), d.err, err)
		}
		return unreadable
	}
	res := notCommitted
	for k, w := range sent {
		e, ok := rows[k]
		now := storeNanos(w.req.Now)
		w.inserted = ok && e.State == server.InProgress && e.Fingerprint == w.req.Fingerprint &&
			storeNanos(e.CreatedAt) == now && storeNanos(e.LockedAt) == now
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
func (s *Store) readBackCompletes(ctx context.Context, d *commitDoubt, batch []*completeWrite, sent map[scopedKey]*completeWrite) readResult {
	rows, err := storeReadBack(ctx, s, d, sent)
	if err != nil {
		for _, w := range batch {
			w.done = false
			w.err = inDoubt(fmt.Sprintf("the completion of key %q in scope %q", w.req.Key, w.req.Scope), d.err, err)
		}
		return unreadable
	}
	res := notCommitted
	for k, w := range sent {
		e, ok := rows[k]
		w.done = ok && e.State == server.Completed && e.Token == w.req.Token
		if w.done {
			res = committed
		}
	}
	return res
}

// storeReadBack waits for the session of a commit in doubt to settle, then
// reads the entries of the keys it wrote.
func storeReadBack[W any](ctx context.Context, s *Store, d *commitDoubt, keys map[scopedKey]W) (map[scopedKey]server.Entry, error) {
	ctx, cancel := readBackCtx(ctx)
	defer cancel()
	if err := settle(ctx, s.pool, d); err != nil {
		return nil, err
	}
	out := make(map[scopedKey]server.Entry, len(keys))
	b := &pgx.Batch{}
	for k := range keys {
		b.Queue(s.q.reread, k.scope, k.key).QueryRow(func(row pgx.Row) error {
			e, err := scanStoreEntry(row)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			if err == nil {
				out[k] = e
			}
			return err
		})
	}
	return out, s.pool.SendBatch(ctx, b).Close()
}
