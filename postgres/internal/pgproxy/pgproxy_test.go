package pgproxy_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres/internal/pgproxy"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// start returns a proxy in front of the tests' server, and a DSN through it.
func start(t *testing.T) (*pgproxy.Proxy, *pgx.ConnConfig) {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgtest.DSN())
	require.NoError(t, err)
	p, err := pgproxy.Start(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	cfg.Host, cfg.Port = "127.0.0.1", uint16(p.Addr().Port)
	cfg.ConnectTimeout = 5 * time.Second
	return p, cfg
}

func connect(t *testing.T, cfg *pgx.ConnConfig) *pgx.Conn {
	t.Helper()
	c, err := pgx.ConnectConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func TestForwardsAndCuts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, cfg := start(t)
	a, b := connect(t, cfg), connect(t, cfg)
	var n int
	require.NoError(t, a.QueryRow(ctx, `SELECT $1::int + 1`, 41).Scan(&n), "the extended protocol passes")
	assert.Equal(t, 42, n)
	require.NoError(t, b.QueryRow(ctx, `SELECT 7`, pgx.QueryExecModeSimpleProtocol).Scan(&n), "the simple one too")
	assert.Equal(t, 2, p.Sessions())

	// One session, by its server process.
	require.True(t, p.CutBackend(a.PgConn().PID()))
	assert.Error(t, a.Ping(ctx), "the cut session is gone")
	assert.NoError(t, b.Ping(ctx), "the other is not")

	p.CutAll()
	assert.Error(t, b.Ping(ctx))
	connect(t, cfg) // a new connection works again
}

func TestRefusesForAWhile(t *testing.T) {
	t.Parallel()
	p, cfg := start(t)
	p.Refuse(time.Hour)
	_, err := pgx.ConnectConfig(context.Background(), cfg)
	require.Error(t, err)
	p.Refuse(0)
	connect(t, cfg)
}

func TestDelaysReplies(t *testing.T) {
	t.Parallel()
	p, cfg := start(t)
	c := connect(t, cfg)
	const d = 50 * time.Millisecond
	p.Delay(d)
	start := time.Now()
	require.NoError(t, c.Ping(context.Background()))
	// A lower bound only: the reply cannot arrive before the delay.
	assert.GreaterOrEqual(t, time.Since(start), d)
}

// A reply held for an hour goes at once when the delay is lifted: a test
// that makes the database slow and then well again does not wait out the
// first delay.
func TestLiftedDelayLetsHeldRepliesGo(t *testing.T) {
	t.Parallel()
	p, cfg := start(t)
	c := connect(t, cfg)
	p.Delay(time.Hour)
	pinged := make(chan error, 1)
	go func() { pinged <- c.Ping(context.Background()) }()
	select {
	case err := <-pinged:
		t.Fatalf("the reply came through a delay of an hour: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	p.Delay(0)
	require.NoError(t, <-pinged)
}

// A COMMIT that the proxy lets through and whose reply it drops: the
// client gets an error, the server committed. Through pgx's extended
// protocol (a batch) and its simple one (Tx.Commit).
func TestDropsTheReplyOfACommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := pgtest.Pool(t)
	schema := pgx.Identifier{pgtest.Schema(t)}.Sanitize()
	_, err := admin.Exec(ctx, `CREATE SCHEMA `+schema+`; CREATE TABLE `+schema+`.t (v int)`)
	require.NoError(t, err)
	p, cfg := start(t)

	c := connect(t, cfg)
	f := p.DropReply(pgproxy.IsCommit)
	tx, err := c.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO `+schema+`.t VALUES (1)`)
	require.NoError(t, err)
	assert.False(t, f.Fired(), "nothing fires before its message")
	require.Error(t, tx.Commit(ctx), "the commit's answer is lost")
	<-f.Done()

	pcfg, err := pgxpool.ParseConfig("")
	require.NoError(t, err)
	pcfg.ConnConfig = cfg
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	defer pool.Close()
	f = p.DropReply(pgproxy.IsCommit)
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`INSERT INTO `+schema+`.t VALUES ($1)`, 2)
	b.Queue(`COMMIT`)
	require.Error(t, pool.SendBatch(ctx, b).Close())
	<-f.Done()

	// An implicit transaction commits at its Sync.
	f = p.DropReply(pgproxy.Executes("INSERT"))
	_, err = pool.Exec(ctx, `INSERT INTO `+schema+`.t VALUES ($1)`, 3)
	require.Error(t, err)
	<-f.Done()

	rows, err := admin.Query(ctx, `SELECT v FROM `+schema+`.t ORDER BY v`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	assert.Equal(t, []int32{1, 2, 3}, got, "every dropped commit was carried out")
}
