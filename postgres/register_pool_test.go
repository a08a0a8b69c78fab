package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// Two journals on one pool (two schemas: two services' journals in one
// process, or a journal migrated to a new schema beside the old), each
// with one client. Register's doc: "A registration that would leave the
// pool no connection for anything else is refused (ErrPoolTooSmall)",
// so that no write waits for a connection that never comes (the hole
// TestRegisterLeavesTheJournalAConnection closed for one journal). On a
// pool of two, the second journal's registration takes the last
// connection: it must be refused, or the journal must still write.
// Found: the second Register takes the last connection and then waits for
// another, for ever: it returns only when its context ends (a bare
// deadline error here, no ErrPoolTooSmall), and idem.New, which registers
// under the caller's context, hangs with a context that has no deadline.
func TestRegisterLeavesAConnectionWhenJournalsShareAPool(t *testing.T) {
	t.Parallel()
	pool := smallPool(t, 2)
	ja := openOn(t, pool, pgtest.Schema(t))
	jb := openOn(t, pool, pgtest.Schema(t))
	unA, err := ja.Register(ctx, "a")
	require.NoError(t, err)
	defer func() { _ = unA() }()
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	unB, err := jb.Register(dctx, "b")
	if err != nil {
		assert.ErrorIs(t, err, postgres.ErrPoolTooSmall, "the registration is refused saying why, not left to wait for a connection")
		return
	}
	defer func() { _ = unB() }()
	_, _, err = ja.Create(dctx, newRecord("tenant"))
	assert.NoError(t, err, "both registrations were accepted, and the pool has no connection left for the journal's writes")
}
