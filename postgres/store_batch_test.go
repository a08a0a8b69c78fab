package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
	"github.com/idemkit/idem/server"
)

var batchT0 = time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC)

func batchStore(t *testing.T) *Store {
	t.Helper()
	s, err := OpenStore(context.Background(), pgtest.Pool(t), Schema(pgtest.Schema(t)))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

func claimOf(key, fp string) *claimWrite {
	return &claimWrite{req: &server.ClaimRequest{Scope: "s", Key: key, Fingerprint: fp, Method: "POST", Path: "/orders",
		Now: batchT0, ExpiresAt: batchT0.Add(time.Hour), StaleBefore: batchT0.Add(-time.Minute)},
		id: storeID("s", key), now: storeNanos(batchT0, 0), expires: storeNanos(batchT0.Add(time.Hour), 0)}
}

func completeOf(key string, token int64, body string) *completeWrite {
	return &completeWrite{req: &server.CompleteRequest{Scope: "s", Key: key, Token: token,
		Response: &server.StoredResponse{Status: 201, Body: []byte(body)}, ExpiresAt: batchT0.Add(2 * time.Hour)},
		id: storeID("s", key), expires: storeNanos(batchT0.Add(2*time.Hour), 0), body: []byte(body)}
}

// TestBatchOfClaimsWithOneKeyTwice: of two claims of one key in a batch,
// the first is inserted and the second is not (it will find the first's
// entry); the other keys of the batch are inserted.
func TestBatchOfClaimsWithOneKeyTwice(t *testing.T) {
	t.Parallel()
	s := batchStore(t)
	first, twice, other := claimOf("k1", "fp-first"), claimOf("k1", "fp-second"), claimOf("k0", "fp")
	s.insertClaims(context.Background(), []*claimWrite{first, twice, other})
	for _, w := range []*claimWrite{first, twice, other} {
		require.NoError(t, w.err)
	}
	assert.True(t, first.inserted)
	assert.False(t, twice.inserted)
	assert.True(t, other.inserted)
	e, err := s.Get(context.Background(), "s", "k1", batchT0)
	require.NoError(t, err)
	assert.Equal(t, "fp-first", e.Fingerprint)
	assert.Equal(t, first.token, e.Token)
}

// TestBatchWithAWriteTheServerRefuses: a batch whose statement fails runs
// each write on its own, so that only the refused one fails. (The store
// keeps any bytes; a trigger, as another program might add, refuses the
// writes marked "bad".)
func TestBatchWithAWriteTheServerRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := batchStore(t)
	table := pgschema.Ident(s.schema) + ".store_entries"
	_, err := s.pool.Exec(ctx, `CREATE FUNCTION `+pgschema.Ident(s.schema)+`.refuse() RETURNS trigger AS $$
		BEGIN
			IF NEW.fingerprint = 'bad' OR NEW.resp_body = 'bad' THEN RAISE EXCEPTION 'refused'; END IF;
			RETURN NEW;
		END $$ LANGUAGE plpgsql;
		CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON `+table+` FOR EACH ROW EXECUTE FUNCTION `+pgschema.Ident(s.schema)+`.refuse()`)
	require.NoError(t, err)
	good1, bad, good2, good3 := claimOf("a", "fp"), claimOf("b", "bad"), claimOf("c", "fp"), claimOf("d", "fp")
	s.insertClaims(ctx, []*claimWrite{good1, bad, good2, good3})
	require.Error(t, bad.err)
	for _, w := range []*claimWrite{good1, good2, good3} {
		require.NoError(t, w.err)
		assert.True(t, w.inserted, "claim of %q", w.req.Key)
	}

	c1, cbad, c2 := completeOf("a", good1.token, "one"), completeOf("d", good3.token, "bad"), completeOf("c", good2.token, "two")
	s.completeAll(ctx, s.q.complete, []*completeWrite{c1, cbad, c2})
	require.Error(t, cbad.err)
	for _, w := range []*completeWrite{c1, c2} {
		require.NoError(t, w.err)
		assert.True(t, w.done)
		e, err := s.Get(ctx, "s", w.req.Key, batchT0)
		require.NoError(t, err)
		assert.Equal(t, string(w.body), string(e.Response.Body))
	}
}

// TestBatchOfCompletesWithOneKeyTwice: two completions of one key with its
// token in a batch: one stores its response, the other learns its lock is
// gone, as if they had come one after the other.
func TestBatchOfCompletesWithOneKeyTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := batchStore(t)
	c := claimOf("k", "fp")
	s.insertClaims(ctx, []*claimWrite{c})
	require.True(t, c.inserted)
	first, second := completeOf("k", c.token, "first"), completeOf("k", c.token, "second")
	s.completeAll(ctx, s.q.complete, []*completeWrite{first, second})
	require.NoError(t, first.err)
	require.NoError(t, second.err)
	assert.True(t, first.done)
	assert.False(t, second.done)
	e, err := s.Get(ctx, "s", "k", batchT0)
	require.NoError(t, err)
	assert.Equal(t, "first", string(e.Response.Body))
}
