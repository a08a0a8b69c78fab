package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// TestCreateWithoutReadingMeetsKeysAndOperationsOfOthers: a create that
// this journal writes without reading (it holds no copy of the key: another
// process wrote the row) inserts with the operation as its one arbiter. A
// key another operation holds fails that insert, and the create is judged
// through the read: idem.ErrDuplicateKey, nothing stored; the same
// operation again returns the stored record, not created.
func TestCreateWithoutReadingMeetsKeysAndOperationsOfOthers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	other := openOn(t, pgtest.Pool(t), schema)
	j := openOn(t, pgtest.Pool(t), schema)

	now := time.Now()
	first := idem.Record{Key: "key-1", Scope: "s", ID: "op-1", Method: "POST", URL: "https://example.com/a",
		Fingerprint: "fp", KeyHeader: "Idempotency-Key", State: idem.StatePending, NextAttemptAt: now}
	stored, created, err := other.Create(ctx, first)
	require.NoError(t, err)
	require.True(t, created)

	taken := first
	taken.ID = "op-2"
	_, created, err = j.Create(ctx, taken)
	require.ErrorIs(t, err, idem.ErrDuplicateKey)
	assert.False(t, created)
	_, err = j.Lookup(ctx, taken.Scope, taken.ID)
	require.ErrorIs(t, err, idem.ErrNotFound, "the refused operation is not stored")

	again, created, err := j.Create(ctx, first)
	require.NoError(t, err)
	assert.False(t, created, "the operation exists")
	assert.Equal(t, stored.Version, again.Version)
	assert.Equal(t, stored.Key, again.Key)

	fresh := first
	fresh.Key, fresh.ID = "key-3", "op-3"
	_, created, err = j.Create(ctx, fresh)
	require.NoError(t, err)
	assert.True(t, created, "a new key and operation are created as before")
}
