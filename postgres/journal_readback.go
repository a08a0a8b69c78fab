package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
)

// readResult is what a read-back found of a commit in doubt.
type readResult uint8

const (
	notCommitted readResult = iota
	committed               // every write has its result, as if the commit had answered
	unreadable              // every write that was sent has an ErrCommitInDoubt error
)

// readBack settles the writes of a batch whose commit is in doubt (see
// indoubt.go). Each write that changes a row with an event (a create, an
// update, a claim) is looked for by its key and its new version, written
// at its time: the transaction is atomic, so one found means it committed.
// Then every write has its result as the commit would have given it, but
// for one whose statement wrote nothing (fastBatch's create of an
// operation that existed, or update of a row changed meanwhile), which
// runs again through the read. A batch of releases alone, which write no
// event, reads as not committed and runs again: a release that had
// committed then fails with ErrLeaseLost, which its caller ignores.
func (j *Journal) readBack(reqs []*writeReq, d *commitDoubt) readResult {
	ctx, cancel := readBackCtx(context.Background())
	defer cancel()
	var recs []idem.Record
	var of []*writeReq
	for _, r := range reqs {
		if r.sent != nil && r.op != opRelease {
			recs, of = append(recs, *r.sent), append(of, r)
		}
	}
	found, err := j.written(ctx, d, recs)
	if err != nil {
		for _, r := range reqs {
			if r.sent != nil {
				r.out, r.created, r.again = idem.Record{}, false, false
				r.err = inDoubt(j.where()+": "+r.describe(), d.err, err)
			}
		}
		return unreadable
	}
	applied := map[*writeReq]bool{}
	for i, ok := range found {
		if ok {
			applied[of[i]] = true
		}
	}
	if len(applied) == 0 {
		for _, r := range reqs {
			if r.sent != nil && r.op != opRelease {
				r.doubted = r.sent
			}
		}
		return notCommitted
	}
	for _, r := range reqs {
		switch {
		case r.sent == nil:
			// Refused by the rules, or to run again: as the batch left it.
		case applied[r] || r.op == opRelease:
			r.out, r.created, r.err = *r.sent, r.op == opCreate, nil
		default:
			r.out, r.created, r.err, r.again = idem.Record{}, false, nil, true
		}
	}
	return committed
}

// written waits for the session of d to settle, then reports, for each
// record, whether its version was written at its time and in its state:
// its event, which every write of a version writes, is in the journal, in
// events or still in the row (see journalKind's migrations 7 and 8).
// Another write of the same version would have needed the operation's
// lease, and at the same millisecond, to the same state, be mistaken for
// it.
func (j *Journal) written(ctx context.Context, d *commitDoubt, recs []idem.Record) ([]bool, error) {
	if err := settle(ctx, j.pool, d); err != nil {
		return nil, err
	}
	found := make([]bool, len(recs))
	if len(recs) == 0 {
		return found, nil
	}
	// A read: it runs again on another session when its own ended, with
	// a batch of its own (a pgx.Batch keeps what the connection it was
	// sent on prepared).
	return found, onLiveSessionRead(ctx, j.pool, func() error {
		b := &pgx.Batch{}
		for i, rec := range recs {
			b.Queue(`SELECT EXISTS (SELECT 1 FROM `+j.q.operations+` o JOIN `+j.q.events+` e ON e.op = o.id
				WHERE o.key = $1 AND e.version = $2 AND e.at = $3 AND e.to_state = $4)
				OR EXISTS (SELECT 1 FROM `+j.q.operations+` WHERE key = $1 AND version = $2 AND ev_at = $3
					AND state = $4 AND ev_kind IS NOT NULL)
				OR EXISTS (SELECT 1 FROM `+j.q.operations+` WHERE key = $1 AND $2::bigint = 1 AND cr_at = $3
					AND cr_state = $4 AND cr_kind IS NOT NULL)`,
				rec.Key, rec.Version, wire.Millis(rec.UpdatedAt), int16(rec.State)).QueryRow(func(row pgx.Row) error {
				return row.Scan(&found[i])
			})
		}
		return j.pool.SendBatch(ctx, b).Close()
	})
}

// where names the journal in errors.
func (j *Journal) where() string { return fmt.Sprintf("postgres journal in schema %q", j.schema) }

// describe names a write in errors.
func (r *writeReq) describe() string {
	switch r.op {
	case opCreate:
		return fmt.Sprintf("the create of operation %s/%s (key %s)", r.rec.Scope, r.rec.ID, r.key)
	case opUpdate:
		return fmt.Sprintf("the update of operation %s/%s (key %s) to %s, version %d", r.rec.Scope, r.rec.ID, r.key, r.rec.State, r.rec.Version+1)
	case opAcquire:
		return fmt.Sprintf("the claim of operation key %s by %s", r.key, r.owner)
	default:
		return fmt.Sprintf("the release of operation key %s by %s", r.key, r.held.Owner)
	}
}

// describeClaim names a Claim's write in errors.
func describeClaim(owner string, recs []idem.Record) string {
	keys := make([]string, len(recs))
	for i, r := range recs {
		keys[i] = r.Key
	}
	return fmt.Sprintf("the claim by %s of operations with keys %s", owner, strings.Join(keys, ", "))
}
