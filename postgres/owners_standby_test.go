package postgres_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// Review (issue 22): ErrReadOnly's doc offers a journal opened on a hot
// standby to be read (idem ls, idem ui on a replica), and Owners' doc says
// it "only reads (a ReadOnly journal, or a read-only session, may call
// it)", and that Alive is "whether its session still holds its liveness
// lock". idem stats and idem ui show it as each worker's status.
//
// What happens: on a standby, Owners reports worker-a, alive and holding
// its lock on the primary, as not alive (Alive false, which idem stats
// and idem ui show as "gone"): advisory locks live in the primary's
// pg_locks, which a standby does not have. A live worker that holds no
// lease is not listed at all. The reads themselves work.
func TestReview3OwnersOnAStandbyCallALiveWorkerGone(t *testing.T) {
	t.Parallel()
	primary := pgtest.StartServer(t)
	standby := primary.StartStandby("standby")
	const schema = "idem"
	w := openOn(t, checkedPool(t, primary.DSN()), schema)
	un, err := w.Register(ctx, "worker-a")
	require.NoError(t, err)
	defer un()
	keys := createRecords(t, w, 2)
	_, err = w.Acquire(ctx, keys[0], "worker-a", time.Hour)
	require.NoError(t, err)
	onPrimary, err := w.Owners(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"worker-a"}, ownerNames(onPrimary))
	require.True(t, onPrimary[0].Alive, "alive, read on the primary")
	primary.WaitReplayed("standby")

	pool := checkedPool(t, standby.DSN())
	for name, opts := range map[string][]postgres.Option{
		"ReadOnly":         {postgres.ReadOnly()},
		"WithoutMigration": {postgres.WithoutMigration()},
	} {
		j := openOn(t, pool, schema, opts...)
		got, err := j.Get(ctx, keys[0])
		require.NoError(t, err, name)
		assert.Equal(t, "worker-a", got.Lease.Owner, name)
		n := 0
		for _, err := range j.List(ctx, idem.Filter{}) {
			require.NoError(t, err, name)
			n++
		}
		assert.Equal(t, 2, n, name)

		owners, err := j.Owners(ctx)
		for _, o := range owners {
			assert.True(t, o.Alive, "%s journal on a standby: Owners says %s is not alive, while it holds its lock on the primary", name, o.Name)
		}
		require.ErrorIs(t, err, postgres.ErrLivenessUnknown, "%s journal on a standby: Owners cannot tell who is alive", name)
	}
}

func ownerNames(owners []postgres.Owner) []string {
	var names []string
	for _, o := range owners {
		names = append(names, o.Name)
	}
	return names
}
