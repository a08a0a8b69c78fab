package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres"
)

// Owners lists the live workers, and the gone ones whose leases active
// operations still carry; not the gone ones that hold nothing.
func TestOwners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	j := openJournal(t)
	held, orphan := newRecord("default"), newRecord("default")
	_, _, err := j.Create(ctx, held)
	require.NoError(t, err)
	_, _, err = j.Create(ctx, orphan)
	require.NoError(t, err)

	live, err := j.Register(ctx, "live")
	require.NoError(t, err)
	defer live()
	_, err = j.Acquire(ctx, held.Key, "live", time.Hour)
	require.NoError(t, err)
	idle, err := j.Register(ctx, "idle")
	require.NoError(t, err)
	defer idle()
	dead, err := j.Register(ctx, "dead")
	require.NoError(t, err)
	_, err = j.Acquire(ctx, orphan.Key, "dead", time.Hour)
	require.NoError(t, err)
	require.NoError(t, dead())
	quit, err := j.Register(ctx, "quit") // gone, holding nothing
	require.NoError(t, err)
	require.NoError(t, quit())

	owners, err := j.Owners(ctx)
	require.NoError(t, err)
	got := map[string]bool{}
	for _, o := range owners {
		got[o.Name] = o.Alive
		assert.False(t, o.RegisteredAt.IsZero(), o.Name)
	}
	assert.Equal(t, map[string]bool{"live": true, "idle": true, "dead": false}, got)
}

// An operator's view of the fleet: which workers are alive, which are gone
// with leases still on active operations.
func ExampleJournal_Owners() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://idem@db.internal:5432/app")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	j, err := postgres.OpenJournal(ctx, pool, postgres.WithoutMigration())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer j.Close()
	owners, err := j.Owners(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, o := range owners {
		fmt.Println(o.Name, o.Alive, o.RegisteredAt)
	}
}
