package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
	"github.com/idemkit/idem/server"
	"github.com/idemkit/idem/server/storetest"
)

var ctx = context.Background()

// openStore opens a store in a schema of its own on the shared pool.
func openStore(t testing.TB, opts ...postgres.Option) *postgres.Store {
	t.Helper()
	return openStoreIn(t, pgtest.Pool(t), pgtest.Schema(t), opts...)
}

func openStoreIn(t testing.TB, pool *pgxpool.Pool, schema string, opts ...postgres.Option) *postgres.Store {
	t.Helper()
	s, err := postgres.OpenStore(ctx, pool, append([]postgres.Option{postgres.Schema(schema)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// newPool opens a pool of its own, as another replica of an API would,
// closed when the test ends.
func newPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(ctx, pgtest.DSN())
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

func TestStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) server.Store { return openStore(t) })
}

func TestStoreDeferredCompletes(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) server.Store { return openStore(t, postgres.DeferCompletes()) })
}

var t0 = time.Date(2031, 3, 14, 15, 9, 26, 535897001, time.UTC)

func claimAt(key, fp string, now time.Time) server.ClaimRequest {
	return server.ClaimRequest{Scope: "tenant", Key: key, Fingerprint: fp, Method: "POST", Path: "/orders",
		Now: now, ExpiresAt: now.Add(24 * time.Hour), StaleBefore: now.Add(-time.Minute)}
}

func TestOpenStoreRefusesAnotherProgramsTables(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	_, err := pool.Exec(ctx, `CREATE SCHEMA `+pgschema.Ident(schema)+`;
		CREATE TABLE `+pgschema.Ident(schema)+`.store_entries (id int PRIMARY KEY, note text)`)
	require.NoError(t, err)
	for name, opts := range map[string][]postgres.Option{
		"migrating":         nil,
		"without migration": {postgres.WithoutMigration()},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := postgres.OpenStore(ctx, pool, append(opts, postgres.Schema(schema))...)
			require.ErrorIs(t, err, server.ErrNotStore)
			assert.Contains(t, err.Error(), schema)
			assert.Contains(t, err.Error(), "name another schema", "the error says what to do")
		})
	}
	require.ErrorIs(t, postgres.MigrateStore(ctx, pool, schema), server.ErrNotStore)
	var cols int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = 'store_entries'`, schema).Scan(&cols))
	assert.Equal(t, 2, cols, "the other program's table is left as it was")
}

func TestOpenStoreRefusesANewerStore(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	require.NoError(t, postgres.MigrateStore(ctx, pool, schema))
	_, err := pool.Exec(ctx, `UPDATE `+pgschema.Ident(schema)+`.idem_schema SET version = 99 WHERE kind = 'store'`)
	require.NoError(t, err)
	for name, opts := range map[string][]postgres.Option{
		"migrating":         nil,
		"without migration": {postgres.WithoutMigration()},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := postgres.OpenStore(ctx, pool, append(opts, postgres.Schema(schema))...)
			require.ErrorIs(t, err, server.ErrSchemaTooNew)
			assert.Contains(t, err.Error(), schema)
			assert.Contains(t, err.Error(), "99")
			assert.Contains(t, err.Error(), "upgrade idem")
		})
	}
}

func TestOpenStoreWithoutMigrationNeedsMigratedTables(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	_, err := postgres.OpenStore(ctx, pool, postgres.Schema(schema), postgres.WithoutMigration())
	require.ErrorIs(t, err, postgres.ErrNotMigrated)
	assert.Contains(t, err.Error(), "do not exist")
	assert.Contains(t, err.Error(), "MigrateStore", "the error says what to do")
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&exists))
	assert.False(t, exists, "opening without migration creates nothing")

	require.NoError(t, postgres.MigrateStore(ctx, pool, schema))
	s := openStoreIn(t, pool, schema, postgres.WithoutMigration())
	res, err := s.Claim(ctx, claimAt("k", "fp", t0))
	require.NoError(t, err)
	assert.True(t, res.Claimed, "a store opened on tables migrated apart works")
}

func TestOpenStoreRefusesBadArguments(t *testing.T) {
	t.Parallel()
	_, err := postgres.OpenStore(ctx, nil)
	require.ErrorContains(t, err, "pgxpool.New")
	_, err = postgres.OpenStore(ctx, pgtest.Pool(t), postgres.Schema(""))
	require.ErrorContains(t, err, "name a schema")
	require.Error(t, postgres.MigrateStore(ctx, nil, "idem"))
}

func TestStoreSharesASchemaWithTheJournal(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	// Another kind of idem's tables, migrated first, as the journal's are.
	other := pgschema.Kind{Name: "journal", Marker: "operations", Migrations: []string{`CREATE TABLE operations (id int)`}}
	require.NoError(t, pgschema.Migrate(ctx, pool, schema, other))
	s := openStoreIn(t, pool, schema)
	assert.Equal(t, schema, s.Schema())
	v, err := pgschema.Version(ctx, pool, schema, other)
	require.NoError(t, err)
	assert.Equal(t, 1, v, "the other kind's version is left alone")
}

func TestDefaultSchemaIsIdem(t *testing.T) {
	t.Parallel()
	// Without migration, so that the test leaves the shared database's
	// default schema as it found it: either its store is there already, or
	// the refusal names the schema the store would have used.
	s, err := postgres.OpenStore(ctx, pgtest.Pool(t), postgres.WithoutMigration())
	if err != nil {
		require.ErrorIs(t, err, postgres.ErrNotMigrated)
		assert.Contains(t, err.Error(), `schema "idem"`)
		return
	}
	defer s.Close()
	assert.Equal(t, "idem", s.Schema())
}

func TestClosedStoreRefusesCallsAndLeavesThePoolOpen(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s, err := postgres.OpenStore(ctx, pool, postgres.Schema(pgtest.Schema(t)))
	require.NoError(t, err)
	c, err := s.Claim(ctx, claimAt("k", "fp", t0))
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close twice is harmless")

	_, err = s.Claim(ctx, claimAt("k2", "fp", t0))
	require.ErrorIs(t, err, server.ErrStoreClosed)
	_, err = s.Get(ctx, "tenant", "k", t0)
	require.ErrorIs(t, err, server.ErrStoreClosed)
	require.ErrorIs(t, s.Renew(ctx, "tenant", "k", c.Token, t0), server.ErrStoreClosed)
	require.ErrorIs(t, s.Release(ctx, "tenant", "k", c.Token), server.ErrStoreClosed)
	require.ErrorIs(t, s.Complete(ctx, server.CompleteRequest{Scope: "tenant", Key: "k", Token: c.Token,
		Response: &server.StoredResponse{Status: 201}, ExpiresAt: t0.Add(time.Hour)}), server.ErrStoreClosed)
	_, err = s.Sweep(ctx, t0)
	require.ErrorIs(t, err, server.ErrStoreClosed)
	require.NoError(t, pool.Ping(ctx), "the pool is the application's: Close leaves it open")
}

func TestStoreWhoseTablesAreGoneSaysWhatToDo(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t), pgtest.Schema(t)
	s := openStoreIn(t, pool, schema)
	_, err := pool.Exec(ctx, `DROP SCHEMA `+pgschema.Ident(schema)+` CASCADE`)
	require.NoError(t, err)
	_, err = s.Claim(ctx, claimAt("k", "fp", t0))
	require.ErrorContains(t, err, "MigrateStore")
	assert.Contains(t, err.Error(), schema)
}

func TestCanceledContextIsReportedAsSuch(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err := s.Claim(cctx, claimAt("k", "fp", t0))
	require.ErrorIs(t, err, context.Canceled)
	_, err = s.Get(cctx, "tenant", "k", t0)
	require.ErrorIs(t, err, context.Canceled)
}

// TestSuccessiveTokensOfAnEntryGrow: claims made one after the other, on
// two replicas, through take-overs, a release and a claim again, and an
// expiry and a replacement, each get a greater token than the one before.
func TestSuccessiveTokensOfAnEntryGrow(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	replicas := []*postgres.Store{openStoreIn(t, pgtest.Pool(t), schema), openStoreIn(t, newPool(t), schema)}
	var tokens []int64
	take := func(i int, req server.ClaimRequest, tookOver bool) int64 {
		t.Helper()
		res, err := replicas[i%2].Claim(ctx, req)
		require.NoError(t, err)
		require.True(t, res.Claimed)
		assert.Equal(t, tookOver, res.TookOver)
		tokens = append(tokens, res.Token)
		return res.Token
	}
	now := t0
	take(0, claimAt("k", "fp", now), false)
	for i := 1; i <= 3; i++ {
		now = now.Add(time.Minute + 1)
		take(i, claimAt("k", "fp", now), true)
	}
	last := tokens[len(tokens)-1]
	require.NoError(t, replicas[0].Release(ctx, "tenant", "k", last))
	take(4, claimAt("k", "fp", now), false)
	now = now.Add(25 * time.Hour)
	take(5, claimAt("k", "other", now), false) // the entry expired: replaced
	for i := 1; i < len(tokens); i++ {
		assert.Greater(t, tokens[i], tokens[i-1], "token %d of %v", i, tokens)
	}
}

// TestClaimsFromTwoReplicasHaveOneWinner races claims of one key from two
// stores on two pools, as two replicas of an API would: one wins, and
// every loser sees the winner's entry. Then the winner's lock goes stale,
// and of as many take-overs one wins.
func TestClaimsFromTwoReplicasHaveOneWinner(t *testing.T) {
	t.Parallel()
	const n = 100
	schema := pgtest.Schema(t)
	replicas := []*postgres.Store{openStoreIn(t, pgtest.Pool(t), schema), openStoreIn(t, newPool(t), schema)}
	race := func(now time.Time) (wins []int64, seen map[int64]int) {
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			mu    sync.Mutex
		)
		seen = map[int64]int{}
		for i := range n {
			wg.Go(func() {
				<-start
				res, err := replicas[i%2].Claim(ctx, claimAt("hot", "fp", now))
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if res.Claimed {
					wins = append(wins, res.Token)
				}
				seen[res.Entry.Token]++
			})
		}
		close(start)
		wg.Wait()
		return wins, seen
	}
	wins, seen := race(t0)
	require.Len(t, wins, 1, "exactly one of %d concurrent claims wins", n)
	assert.Equal(t, map[int64]int{wins[0]: n}, seen, "every loser sees the winner's entry")

	first := wins[0]
	wins, seen = race(t0.Add(2 * time.Minute))
	require.Len(t, wins, 1, "exactly one of %d concurrent take-overs wins", n)
	assert.Greater(t, wins[0], first)
	assert.Equal(t, map[int64]int{wins[0]: n}, seen, "every loser sees the taker's entry")
}

// TestSweepFromTwoReplicasAtOnce: replicas that sweep at once share the
// work, and delete each expired entry once.
func TestSweepFromTwoReplicasAtOnce(t *testing.T) {
	t.Parallel()
	const total = 2000
	schema := pgtest.Schema(t)
	replicas := []*postgres.Store{openStoreIn(t, pgtest.Pool(t), schema), openStoreIn(t, newPool(t), schema)}
	for i := range total {
		_, err := replicas[0].Claim(ctx, claimAt(fmt.Sprint("k", i), "fp", t0))
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	swept := make([]int, len(replicas))
	for i, s := range replicas {
		wg.Go(func() {
			n, err := s.Sweep(ctx, t0.Add(24*time.Hour))
			assert.NoError(t, err)
			swept[i] = n
		})
	}
	wg.Wait()
	// A sweep that skipped rows the other held stops early; one more
	// sweep finishes whatever both left.
	rest, err := replicas[0].Sweep(ctx, t0.Add(24*time.Hour))
	require.NoError(t, err)
	assert.Equal(t, total, swept[0]+swept[1]+rest, "each entry is deleted once: %v + %d", swept, rest)
	_, err = replicas[1].Get(ctx, "tenant", "k0", t0)
	require.ErrorIs(t, err, server.ErrNotFound)
}

// TestClaimAndReleaseRaceKeepsOneHolder: goroutines on two replicas claim
// one key and release it, over and over, so that claims run into rows
// that are being deleted and inserted under them. The key never has two
// holders at once, and every holder's release finds its own lock.
func TestClaimAndReleaseRaceKeepsOneHolder(t *testing.T) {
	t.Parallel()
	const workers, rounds = 8, 40
	schema := pgtest.Schema(t)
	replicas := []*postgres.Store{openStoreIn(t, pgtest.Pool(t), schema), openStoreIn(t, newPool(t), schema)}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		holders int
		claims  int
	)
	for i := range workers {
		wg.Go(func() {
			s := replicas[i%2]
			for range rounds {
				res, err := s.Claim(ctx, claimAt("hot", "fp", t0))
				if !assert.NoError(t, err) || !res.Claimed {
					continue
				}
				mu.Lock()
				holders++
				claims++
				assert.Equal(t, 1, holders, "two requests hold the key at once")
				holders--
				mu.Unlock()
				assert.NoError(t, s.Release(ctx, "tenant", "hot", res.Token))
			}
		})
	}
	wg.Wait()
	assert.Positive(t, claims)
	t.Logf("%d claims of %d won", claims, workers*rounds)
}
