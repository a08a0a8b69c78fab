package postgres_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/server"
)

// TestStoreTokensAreNotHandedOutAgainAfterAnAsynchronousFailover: the
// store fences every write of a key's holder by its token, drawn from a
// sequence so that no token is handed out twice. PostgreSQL logs a
// sequence 32 values ahead; a standby cut off from its primary before the
// primary logged the values it went on to hand out starts, once promoted,
// from what it received, and hands the same tokens out again. A handler
// that claimed key K on the old primary (token t), and whose key the
// fail-over lost, is then fenced by nothing on the new one: when a retry
// of K there draws t, the old handler's late Release deletes the new
// handler's lock, and a third request with K runs while the second does.
// The README's cost of an asynchronous fail-over is a retry that runs the
// handler again, not two runs at once.
func TestStoreTokensAreNotHandedOutAgainAfterAnAsynchronousFailover(t *testing.T) {
	t.Parallel()
	primary, standby, dsn := failoverPair(t, false)
	pool := checkedPool(t, dsn)
	const schema = "idem_store"
	s := openStoreIn(t, pool, schema)
	now := time.Now()
	claim := func(key string) server.ClaimResult {
		t.Helper()
		res, err := s.Claim(ctx, claimAt(key, "fp", now))
		require.NoError(t, err, "claim of %s", key)
		return res
	}
	for i := range 3 {
		require.True(t, claim(fmt.Sprintf("before-%d", i)).Claimed)
	}
	primary.WaitReplayed("standby")
	standby.Detach()

	// Acknowledged by the old primary alone: past the values it had logged.
	old := map[int64]bool{}
	for i := range 40 {
		res := claim(fmt.Sprintf("filler-old-%d", i))
		require.True(t, res.Claimed)
		old[res.Token] = true
	}
	held := claim("K") // its handler runs, holding token held.Token
	require.True(t, held.Claimed)
	old[held.Token] = true

	primary.Crash()
	standby.Promote()

	// On the new primary, retries and new requests draw tokens.
	var last int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT last_value FROM `+pgschema.Ident(schema)+`.store_tokens`).Scan(&last))
	for i := 0; last+1 < held.Token; i++ {
		res := claim(fmt.Sprintf("filler-new-%d", i))
		require.True(t, res.Claimed)
		last = res.Token
	}
	retry := claim("K") // the fail-over lost K: the retry runs the handler again
	require.True(t, retry.Claimed)
	assert.False(t, old[retry.Token], "token %d was handed out on the old primary and again on the new one", retry.Token)

	// The first handler, still running, fails and releases its key.
	err := s.Release(ctx, "tenant", "K", held.Token)
	third := claim("K")
	assert.False(t, third.Claimed, "a third request with K runs while the second does (the first's late Release: %v)", err)
}
