package postgres_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestCopyOfARowLostInAFailoverWritesNothing: a journal keeps a copy of
// each active row it wrote, and writes the row again without reading it
// when the row's id and xmin are still those it wrote (fastBatch). An
// asynchronous fail-over loses the last rows the primary wrote, and the
// promoted standby hands out their ids and transaction ids again. Here
// another journal's create on the new primary gets the id and the xmin of
// a row the first journal created before the fail-over: the first
// journal's next write of its lost operation must not land on the other
// operation's row. It must find its operation gone, and the other
// operation's record must stay as it was created.
func TestCopyOfARowLostInAFailoverWritesNothing(t *testing.T) {
	t.Parallel()
	primary, standby, dsn := failoverPair(t, false)
	ja := openOn(t, checkedPool(t, dsn), "idem")
	jb := openOn(t, checkedPool(t, dsn), "idem")
	lease := idem.Lease{Owner: "worker-a", ExpiresAt: time.Now().Add(time.Hour)}
	create := func(j idem.Journal) idem.Record {
		t.Helper()
		rec := newRecord("failover")
		rec.State, rec.Lease = idem.StateInFlight, lease
		out, created, err := j.Create(ctx, rec)
		require.NoError(t, err)
		require.True(t, created)
		return out
	}
	create(ja) // the tables, and a row, replicated
	primary.WaitReplayed("standby")
	standby.Detach()

	// Rows only the primary gets, each in a transaction of its own; ja
	// keeps a copy of each.
	type row struct {
		rec  idem.Record
		id   int64
		xmin int64
	}
	where := func(dsn string) func(key string) (id, xmin int64) {
		pool := checkedPool(t, dsn)
		return func(key string) (id, xmin int64) {
			t.Helper()
			require.NoError(t, pool.QueryRow(ctx, `SELECT id, xmin::text::bigint FROM idem.operations WHERE key = $1`, key).Scan(&id, &xmin))
			return id, xmin
		}
	}
	onPrimary := where(primary.DSN())
	var lost []row
	for range 10 {
		r := row{rec: create(ja)}
		r.id, r.xmin = onPrimary(r.rec.Key)
		lost = append(lost, r)
	}
	primary.Crash()
	standby.Promote()

	// On the new primary, jb creates an operation in the transaction, and
	// with the id, of one of the lost rows.
	newPrimary := checkedPool(t, standby.DSN())
	onNew := where(standby.DSN())
	var hit *row
	var xid int64 // the new primary's last transaction id
	require.NoError(t, newPrimary.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&xid))
	var victim idem.Record
	for i := range lost {
		r := &lost[i]
		// Each statement below is a transaction of its own, and takes the
		// next transaction id: up to the lost row's, less two; then the
		// sequence's setval; then jb's create.
		if xid >= r.xmin-1 {
			continue // its transaction id is used already
		}
		for xid < r.xmin-2 {
			require.NoError(t, newPrimary.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&xid))
		}
		require.NoError(t, newPrimary.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint
			FROM setval(pg_get_serial_sequence('idem.operations', 'id'), $1)`, r.id-1).Scan(&xid))
		if xid != r.xmin-1 {
			t.Logf("lost row %d (xmin %d): the new primary is at transaction %d", r.id, r.xmin, xid)
			continue // this one's transaction id is used already
		}
		rec := create(jb)
		id, xmin := onNew(rec.Key)
		xid = xmin
		t.Logf("lost row %d (xmin %d); created on the new primary: row %d (xmin %d)", r.id, r.xmin, id, xmin)
		if id == r.id && xmin == r.xmin {
			hit, victim = r, rec
			break
		}
	}
	require.NotNil(t, hit, "no create on the new primary got the id and transaction id of a lost row: %+v", lost)

	// ja writes the outcome of its lost operation.
	next := hit.rec
	next.State = idem.StateSucceeded
	next.Response = &idem.Response{StatusCode: 201, Header: map[string][]string{}, Body: []byte(`{"order":"lost"}`)}
	_, err := ja.Update(ctx, next, idem.Deferred, idem.Event{Kind: idem.EventAnswer})
	assert.ErrorIs(t, err, idem.ErrNotFound, "the outcome of an operation the fail-over lost")
	got, err := jb.Get(ctx, victim.Key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateInFlight, got.State, "the other operation's record: %+v", got)
	assert.Nil(t, got.Response, "the other operation's record")
	assert.Equal(t, victim.Version, got.Version, "the other operation's record")
	_, err = jb.Get(ctx, hit.rec.Key)
	assert.ErrorIs(t, err, idem.ErrNotFound)
}
