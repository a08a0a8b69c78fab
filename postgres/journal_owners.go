package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
)

// An owner's liveness lock is the advisory lock (owners, id): the first key
// is the OID of the schema's owners table, the second the owner's number
// in it. Owners are numbered from 1 in every schema; the table's OID, unique
// in the database, keeps the journals of two schemas from taking each
// other's locks (and so from seeing a dead owner alive, or waiting on a
// live one of the other schema to register).

// livenessClass is the first key of the schema's liveness locks: the
// owners table's OID, as the signed int4 that pg_advisory_lock takes.
func (j *Journal) livenessClass() int32 { return int32(j.ownersOID) }

// Register implements idem.Journal. The owner's name goes into the owners
// table (a name is registered once, ever), and a connection of the pool is
// set aside for as long as the owner is registered, holding a
// session-level advisory lock on the owner's number. PostgreSQL drops the
// lock when that session ends, however the worker ended: that is how the
// others see it gone. The connection goes back to the pool on unregister.
func (j *Journal) Register(ctx context.Context, owner string) (func() error, error) {
	if owner == "" {
		return nil, fmt.Errorf("%w: Register needs an owner name", idem.ErrInvalidRecord)
	}
	done, err := j.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	var id int32
	if err := j.pool.QueryRow(ctx, j.q.register, owner, wire.Millis(j.now())).Scan(&id); err != nil {
		if _, ok := isUniqueViolation(err); ok {
			return nil, fmt.Errorf("%w: owner %q registered before; each registration needs a new name", idem.ErrInvalidRecord, owner)
		}
		return nil, classify(ctx, err)
	}
	if !j.liveness {
		return func() error { return nil }, nil
	}
	conn, err := j.pool.Acquire(ctx)
	if err != nil {
		return nil, classify(ctx, err)
	}
	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, j.livenessClass(), id).Scan(&locked); err != nil {
		conn.Release()
		return nil, classify(ctx, err)
	}
	if !locked {
		// Only this registration takes this lock; another session holds it
		// when something else uses advisory locks with the same two keys.
		conn.Release()
		return nil, fmt.Errorf("postgres journal in schema %q: owner %q's liveness lock (advisory lock %d, %d) is held by another session",
			j.schema, owner, j.livenessClass(), id)
	}
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		conn.Release()
		return nil, idem.ErrJournalClosed
	}
	j.mine[owner] = conn
	j.mu.Unlock()
	return func() error { return j.unregister(owner, id) }, nil
}

func (j *Journal) unregister(owner string, id int32) error {
	j.mu.Lock()
	conn := j.mine[owner]
	delete(j.mine, owner)
	j.gone[owner] = true
	j.mu.Unlock()
	if conn == nil {
		return nil // unregistered before, or the journal was closed
	}
	defer conn.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1, $2)`, j.livenessClass(), id)
	if err != nil {
		// The session's lock may outlive the call: end the session.
		_ = conn.Conn().Close(ctx)
	}
	return err
}

// isGone reports whether owner registered and its session no longer holds
// its lock. An owner this journal does not know of is not known to be
// gone: its leases lapse.
func (j *Journal) isGone(owner string) bool {
	if !j.liveness || owner == "" {
		return false
	}
	j.mu.Lock()
	gone, mine := j.gone[owner], j.mine[owner] != nil
	j.mu.Unlock()
	if gone || mine {
		return gone
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := j.pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory'
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND l.classid = $1::bigint::oid AND l.objid = o.id::oid AND l.objsubid = 2 AND l.granted)
		FROM `+j.q.table("owners")+` o WHERE o.name = $2`, int64(j.ownersOID), owner).Scan(&gone)
	if err != nil {
		return false // unknown (never registered here), or cannot tell
	}
	if gone {
		j.mu.Lock()
		j.gone[owner] = true
		j.mu.Unlock()
	}
	return gone
}

// goneOwners returns the owners of live leases on due records whose owner
// is gone, for Claim's query.
func (j *Journal) goneOwners(ctx context.Context, tx pgx.Tx, due, now time.Time) ([]string, error) {
	if !j.liveness {
		return nil, nil
	}
	rows, err := tx.Query(ctx, j.q.goneOwners, wire.Millis(due), wire.Millis(now))
	if err != nil {
		return nil, err
	}
	owners, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	var gone []string
	for _, o := range owners {
		if j.isGone(o) {
			gone = append(gone, o)
		}
	}
	return gone, nil
}
