package postgres_test

import (
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// TestJournalOfVersion7OpenedByWorkersAtOnce: a journal that an idem with
// schema 7 wrote (a settled operation whose events are in events, one
// active and due whose creation event is in events, one at version 1
// whose creation event its row holds) is opened by four workers at once,
// each on a pool of its own, as processes starting together after an
// upgrade: one migrates it to 8, the others wait for it and find it
// migrated. Each then creates and settles operations of its own (writes
// without a read, which keep the creation event in the row), while one
// claims the old operations and settles them (after a read). Every
// operation's history is then whole: versions 1 to the last, once each,
// the creation first.
func TestJournalOfVersion7OpenedByWorkersAtOnce(t *testing.T) {
	t.Parallel()
	pool, schema, s := journalOfVersion(t, 7)
	insertDoneAndLive(t, pool, s, time.Now().Add(-time.Hour).UnixMilli())
	old := time.Now().Add(-time.Hour).UnixMilli()
	_, err := pool.Exec(ctx, `INSERT INTO `+s+`.operations (key, scope, op_id, method, url, body, fingerprint, key_quoted,
			resends, state, attempts, next_attempt_at, lease_epoch, created_at, updated_at, version, ev_at, ev_kind, ev_owner)
		VALUES ('k-held', 'shop', 'held', 'POST', 'http://x/orders', '\x7b7d', 'fp3', false, 0, 1,
			0, `+itoa(old)+`, 0, `+itoa(old)+`, `+itoa(old)+`, 1, `+itoa(old)+`, 1, NULL);
		INSERT INTO `+s+`.due SELECT next_attempt_at, id FROM `+s+`.operations WHERE key IN ('k-live', 'k-held')`)
	require.NoError(t, err)

	const workers = 4
	journals := make([]*postgres.Journal, workers)
	created := make([][]string, workers)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wp, err := pgxpool.New(ctx, pgtest.DSN())
		require.NoError(t, err)
		t.Cleanup(wp.Close)
		wg.Add(1)
		go func() {
			defer wg.Done()
			j, err := postgres.OpenJournal(ctx, wp, postgres.Schema(schema), postgres.WithoutLiveness())
			if err != nil {
				errs <- err
				return
			}
			journals[w] = j
			for range 5 {
				rec := newRecord("shop")
				rec.State, rec.Attempts = idem.StateInFlight, 1
				rec.Lease = idem.Lease{Owner: "w", ExpiresAt: time.Now().Add(time.Minute)}
				c, _, err := j.Create(ctx, rec)
				if err != nil {
					errs <- err
					return
				}
				next := c
				next.State, next.Response = idem.StateSucceeded, &idem.Response{StatusCode: 201}
				if _, err := j.Update(ctx, next, idem.Buffered, idem.Event{Kind: idem.EventAnswer}); err != nil {
					errs <- err
					return
				}
				created[w] = append(created[w], c.Key)
			}
			if w == 0 {
				claimed, err := j.Claim(ctx, idem.ClaimRequest{Owner: "w0", Lease: time.Minute, Limit: 10})
				if err != nil {
					errs <- err
					return
				}
				for _, r := range claimed {
					next := r
					next.State, next.Response = idem.StateSucceeded, &idem.Response{StatusCode: 201}
					if _, err := j.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventAnswer}); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for _, j := range journals {
		defer j.Close()
	}
	var version int
	require.NoError(t, pool.QueryRow(ctx, `SELECT version FROM `+s+`.idem_schema WHERE kind = 'journal'`).Scan(&version))
	assert.Equal(t, 8, version)

	keys := []string{"k-done", "k-live", "k-held"}
	for _, ks := range created {
		keys = append(keys, ks...)
	}
	require.Len(t, keys, 3+workers*5)
	for _, key := range keys {
		rec, err := journals[1].Get(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, idem.StateSucceeded, rec.State, key)
		h, err := journals[2].History(ctx, key)
		require.NoError(t, err)
		require.Len(t, h, int(rec.Version), "%s: each version's event once", key)
		for i, ev := range h {
			assert.Equal(t, int64(i+1), ev.Version, key)
		}
		assert.Equal(t, idem.EventCreate, h[0].Kind, key)
	}
}
