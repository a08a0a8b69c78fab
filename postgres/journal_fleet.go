package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/wire"
)

// An Owner is a worker registered with the journal (Register): its name,
// when it registered, and whether it is alive, that is whether its
// session still holds its liveness lock.
type Owner struct {
	Name         string
	RegisteredAt time.Time
	Alive        bool
}

// ErrLivenessUnknown reports Owners called on a hot standby: the liveness
// locks live in the primary's memory alone, and a standby would call every
// worker gone, the live ones too. Run it against the primary.
var ErrLivenessUnknown = errors.New("liveness unknown on a standby: run this against the primary")

// Owners returns the workers an operator of the fleet needs to see: those
// alive, and those gone whose leases active operations still carry,
// oldest registration first. It only reads (a ReadOnly journal, or a
// read-only session, may call it) and takes no lock; under
// WithoutLiveness no worker is known alive. On a hot standby
// (pg_is_in_recovery) it returns an error matching ErrLivenessUnknown and
// no owners: whether a worker is alive can be read only on the primary.
func (j *Journal) Owners(ctx context.Context) ([]Owner, error) {
	done, err := j.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	var owners []Owner
	standby := false
	err = j.read(ctx, func(q reader) error {
		if err := q.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&standby); err != nil || standby {
			return err
		}
		rows, err := q.Query(ctx, `SELECT o.name, o.registered_at, $2::bool AND EXISTS (SELECT 1 FROM pg_locks l
				WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
				AND l.classid = $1::bigint::oid AND l.objid = o.id::oid AND l.objsubid = 2 AND l.granted) AS alive
			FROM `+j.q.table("owners")+` o
			WHERE o.name IN (SELECT a.lease_owner FROM `+j.q.due+` d JOIN `+j.q.operations+` a ON a.id = d.id
				WHERE a.state IN (1, 2, 3) AND a.lease_owner IS NOT NULL)
			OR EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory'
				AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND l.classid = $1::bigint::oid
				AND l.objid = o.id::oid AND l.objsubid = 2 AND l.granted)
			ORDER BY o.registered_at, o.id`, int64(j.ownersOID), j.liveness)
		if err != nil {
			return err
		}
		owners, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Owner, error) {
			var o Owner
			var at int64
			err := row.Scan(&o.Name, &at, &o.Alive)
			o.RegisteredAt = wire.FromMillis(at)
			return o, err
		})
		return err
	})
	if err == nil && standby {
		return nil, fmt.Errorf("postgres journal in schema %q: listing owners: %w", j.schema, ErrLivenessUnknown)
	}
	return owners, j.fail(ctx, "listing owners", err)
}
