package postgres

import (
	"cmp"
	"context"
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
	err      error
}

// completeWrite is one completion in a batch.
type completeWrite struct {
	req     *server.CompleteRequest
	id      []byte // storeID of the request's scope and key
	expires int64  // req.ExpiresAt on the server's clock
	body    []byte
	header  []byte
	done    bool // the token held the lock, and the response is stored
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
	rows, err := s.pool.Query(ctx, s.q.insert, ids, scopes, keys, fps, methods, paths, nows, expires)
	if err == nil {
		for rows.Next() {
			var (
				id    []byte
				token int64
			)
			if err = rows.Scan(&id, &token); err != nil {
				break
			}
			if w := sent[string(id)]; w != nil {
				w.inserted, w.token = true, token
			}
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
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
		sent  = make(map[string]bool, len(batch))
		again []*completeWrite
		b     = &pgx.Batch{}
	)
	// One statement per entry, sent at once: pgx runs a batch outside a
	// transaction as one implicit transaction, so they commit together.
	for _, w := range batch {
		if sent[string(w.id)] {
			again = append(again, w)
			continue
		}
		sent[string(w.id)] = true
		b.Queue(q, w.id, w.req.Token, w.expires, int32(w.req.Response.Status),
			w.header, w.body).Exec(func(tag pgconn.CommandTag) error {
			w.done = tag.RowsAffected() == 1
			return nil
		})
	}
	err := s.pool.SendBatch(ctx, b).Close()
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
