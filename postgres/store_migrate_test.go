package postgres_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
	"github.com/idemkit/idem/server"
)

// TestStoreMigratesFromVersion1: a store that an idem with text columns
// keyed by (scope, key) wrote opens, migrated to bytes keyed by a hash,
// with its entries as they were: a completed one replays its response, an
// in-progress one still holds its lock for its token, and new claims of
// what version 1 refused (a path that is not UTF-8) work.
func TestStoreMigratesFromVersion1(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	require.NoError(t, postgres.MigrateStoreTo(ctx, pool, schema, 1))
	s := pgschema.Ident(schema)
	expires := t0.Add(24 * 3600e9).UnixNano()
	_, err := pool.Exec(ctx, `INSERT INTO `+s+`.store_entries (scope, key, fingerprint, method, path, state, token,
			created_at, locked_at, expires_at, resp_status, resp_header, resp_body)
		VALUES ('tenant', 'done', 'fp1', 'POST', '/orders/café', 2, 7, $1, $1, $2, 201, '{"X-A":["b"]}', 'made'),
			('tenant', 'busy', 'fp2', 'POST', '/orders', 1, 8, $1, $1, $2, NULL, NULL, NULL)`,
		t0.UnixNano(), expires)
	require.NoError(t, err)

	_, err = postgres.OpenStore(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration())
	require.ErrorIs(t, err, postgres.ErrNotMigrated, "version 1 is older than this build")
	st := openStoreIn(t, pool, schema)

	done, err := st.Get(ctx, "tenant", "done", t0)
	require.NoError(t, err)
	assert.Equal(t, server.Completed, done.State)
	assert.Equal(t, "/orders/café", done.Path, "text is kept as its UTF-8 bytes")
	require.NotNil(t, done.Response)
	assert.Equal(t, http.StatusCreated, done.Response.Status)
	assert.Equal(t, "b", done.Response.Header.Get("X-A"))
	assert.Equal(t, "made", string(done.Response.Body))
	res, err := st.Claim(ctx, claimAt("done", "fp1", t0))
	require.NoError(t, err)
	assert.False(t, res.Claimed, "the migrated row is found by its scope and key")

	require.ErrorIs(t, st.Complete(ctx, server.CompleteRequest{Scope: "tenant", Key: "busy", Token: 9,
		Response: &server.StoredResponse{Status: 201}, ExpiresAt: t0}), server.ErrLockLost)
	require.NoError(t, st.Renew(ctx, "tenant", "busy", 8, t0), "the in-progress entry keeps its token")

	req := claimAt("new", "fp3", t0)
	req.Path = "/files/caf\xe9.txt"
	res, err = st.Claim(ctx, req)
	require.NoError(t, err)
	assert.True(t, res.Claimed)
	assert.Equal(t, req.Path, mustStoreGet(t, st, "new").Path)
}

func mustStoreGet(t *testing.T, s *postgres.Store, key string) server.Entry {
	t.Helper()
	e, err := s.Get(ctx, "tenant", key, t0)
	require.NoError(t, err)
	return e
}
