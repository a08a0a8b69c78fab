package postgres_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgproxy"
	"github.com/idemkit/idem/postgres/internal/pgtest"
	"github.com/idemkit/idem/server"
)

// proxiedPool returns a proxy in front of the tests' server and a pool of
// the test's own that connects through it.
func proxiedPool(t *testing.T) (*pgproxy.Proxy, *pgxpool.Pool) {
	t.Helper()
	return proxiedPoolOf(t, 4)
}

// proxiedPoolOf is proxiedPool with at most maxConns connections.
func proxiedPoolOf(t *testing.T, maxConns int32) (*pgproxy.Proxy, *pgxpool.Pool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	require.NoError(t, err)
	p, err := pgproxy.Start(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(p.Addr().Port)
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return p, pool
}

// proxiedJournal opens a journal in a schema of its own through a proxy;
// direct reads the same schema without it.
func proxiedJournal(t *testing.T) (p *pgproxy.Proxy, j, direct *postgres.Journal) {
	t.Helper()
	return proxiedJournalOf(t, 4)
}

// proxiedJournalOf is proxiedJournal on a pool of at most maxConns
// connections.
func proxiedJournalOf(t *testing.T, maxConns int32) (p *pgproxy.Proxy, j, direct *postgres.Journal) {
	t.Helper()
	p, pool := proxiedPoolOf(t, maxConns)
	schema := pgtest.Schema(t)
	j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema))
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	direct, err = postgres.OpenJournal(ctx, pgtest.Pool(t), postgres.Schema(schema))
	require.NoError(t, err)
	t.Cleanup(func() { _ = direct.Close() })
	return p, j, direct
}

// commitsWrite matches the message that commits a journal write: a
// COMMIT, or the statement of a write made without a read
// (Journal.fastBatch), which commits in its pipeline's implicit
// transaction at the Sync that follows, setting its commit level itself
// (the one-row subquery lvl).
func commitsWrite(m pgproxy.Message) bool {
	return pgproxy.IsCommit(m) || pgproxy.Executes("set_config('synchronous_commit'", ") AS lvl")(m)
}

// fired fails the test unless the fault fired: a test whose fault never
// met its message would show nothing.
func fired(t *testing.T, f *pgproxy.Fault) {
	t.Helper()
	require.True(t, f.Fired(), "the proxy never met the message to drop the reply of")
}

// Each kind of journal write whose COMMIT reaches the server and whose
// acknowledgement is lost: the journal reads it back and answers as the
// commit did.
func TestJournalWriteWhoseAcknowledgementIsLost(t *testing.T) {
	t.Parallel()
	leased := func(owner string) idem.Record {
		rec := newRecord("shop")
		rec.State, rec.Attempts = idem.StateInFlight, 1
		rec.Lease = idem.Lease{Owner: owner, ExpiresAt: time.Now().Add(time.Minute)}
		return rec
	}

	t.Run("create", func(t *testing.T) {
		t.Parallel()
		p, j, direct := proxiedJournal(t)
		f := p.DropReply(commitsWrite)
		rec := leased("w1")
		got, created, err := j.Create(ctx, rec)
		fired(t, f)
		require.NoError(t, err)
		assert.True(t, created, "the create committed: it is this call's")
		assert.Equal(t, rec.Key, got.Key)
		stored, err := direct.Get(ctx, rec.Key)
		require.NoError(t, err)
		assert.Equal(t, stored.Version, got.Version)
		assert.Equal(t, stored.Lease, got.Lease)
	})

	for _, dur := range []idem.Durability{idem.Durable, idem.Deferred} {
		t.Run("update "+dur.String(), func(t *testing.T) {
			t.Parallel()
			p, j, direct := proxiedJournal(t)
			created, _, err := j.Create(ctx, leased("w1"))
			require.NoError(t, err)
			next := created
			next.State = idem.StateSucceeded
			next.Response = &idem.Response{StatusCode: 201, Header: http.Header{}}
			f := p.DropReply(commitsWrite)
			got, err := j.Update(ctx, next, dur, idem.Event{Kind: idem.EventAnswer})
			fired(t, f)
			require.NoError(t, err, "the update committed; the journal holds it")
			assert.Equal(t, idem.StateSucceeded, got.State)
			stored, err := direct.Get(ctx, created.Key)
			require.NoError(t, err)
			assert.Equal(t, stored.Version, got.Version)
			assert.Equal(t, idem.StateSucceeded, stored.State)
		})
	}

	t.Run("acquire", func(t *testing.T) {
		t.Parallel()
		p, j, direct := proxiedJournal(t)
		created, _, err := j.Create(ctx, newRecord("shop"))
		require.NoError(t, err)
		f := p.DropReply(commitsWrite)
		got, err := j.Acquire(ctx, created.Key, "w2", time.Minute)
		fired(t, f)
		require.NoError(t, err, "the claim committed: it is this call's")
		stored, err := direct.Get(ctx, created.Key)
		require.NoError(t, err)
		assert.Equal(t, stored.Lease, got.Lease)
	})

	t.Run("claim", func(t *testing.T) {
		t.Parallel()
		p, j, direct := proxiedJournal(t)
		created, _, err := j.Create(ctx, newRecord("shop"))
		require.NoError(t, err)
		f := p.DropReply(commitsWrite)
		got, err := j.Claim(ctx, idem.ClaimRequest{Owner: "w2", Lease: time.Minute, Limit: 5})
		fired(t, f)
		require.NoError(t, err, "the claim committed: its operations are this call's")
		require.Len(t, got, 1)
		stored, err := direct.Get(ctx, created.Key)
		require.NoError(t, err)
		assert.Equal(t, stored.Lease, got[0].Lease)
	})

	t.Run("renew", func(t *testing.T) {
		t.Parallel()
		p, j, direct := proxiedJournal(t)
		created, _, err := j.Create(ctx, leased("w1"))
		require.NoError(t, err)
		f := p.DropReply(commitsWrite)
		n, err := j.Renew(ctx, map[string]idem.Lease{created.Key: created.Lease}, time.Hour)
		fired(t, f)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		stored, err := direct.Get(ctx, created.Key)
		require.NoError(t, err)
		assert.True(t, stored.Lease.ExpiresAt.After(time.Now().Add(30*time.Minute)), "renewed")
	})

	t.Run("sync", func(t *testing.T) {
		t.Parallel()
		p, j, _ := proxiedJournal(t)
		f := p.DropReply(pgproxy.Executes("UPDATE", ".sync AS s"))
		err := j.Sync(ctx)
		fired(t, f)
		require.NoError(t, err, "the sync committed, and with it every commit before")
	})
}

// The store's claim and completion whose COMMIT reaches the server and
// whose acknowledgement is lost: the store reads them back.
func TestStoreWriteWhoseAcknowledgementIsLost(t *testing.T) {
	t.Parallel()
	p, pool := proxiedPool(t)
	schema := pgtest.Schema(t)
	s := openStoreIn(t, pool, schema)
	direct := openStoreIn(t, pgtest.Pool(t), schema)
	now := time.Now()

	f := p.DropReply(pgproxy.Executes("INSERT INTO", "store_entries"))
	res, err := s.Claim(ctx, claimAt("k1", "fp", now))
	fired(t, f)
	require.NoError(t, err)
	assert.True(t, res.Claimed, "the claim committed: the key is this request's")
	e, err := direct.Get(ctx, "tenant", "k1", now)
	require.NoError(t, err)
	assert.Equal(t, e.Token, res.Token)

	f = p.DropReply(pgproxy.Executes("UPDATE", "store_entries", "resp_status"))
	err = s.Complete(ctx, server.CompleteRequest{Scope: "tenant", Key: "k1", Token: res.Token, ExpiresAt: now.Add(time.Hour),
		Response: &server.StoredResponse{Status: 201, Header: http.Header{}, Body: []byte("made")}})
	fired(t, f)
	require.NoError(t, err, "the completion committed")
	e, err = direct.Get(ctx, "tenant", "k1", now)
	require.NoError(t, err)
	assert.Equal(t, server.Completed, e.State)
}

// clientOfACountingServer returns a client on j, with an hour's lease, of
// a server that answers every request 201 with an order, and the count of
// the requests the server had.
func clientOfACountingServer(t *testing.T, j idem.Journal) (*idem.Client, *atomic.Int32) {
	t.Helper()
	hits := new(atomic.Int32)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		hits.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"order":1}`))
	}))
	t.Cleanup(srv.Close)
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, LeaseDuration: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c, hits
}

// doWithTheIntentsCommitInDoubt runs Do for op while the reply to its
// intent's commit is lost and the database refuses every connection: Do
// fails in doubt, having sent nothing. The database answers again after.
func doWithTheIntentsCommitInDoubt(t *testing.T, p *pgproxy.Proxy, c *idem.Client, hits *atomic.Int32, op idem.Op) error {
	t.Helper()
	f := p.DropReplyAndRefuse(commitsWrite, time.Hour)
	_, err := c.Do(ctx, op)
	fired(t, f)
	require.ErrorIs(t, err, postgres.ErrCommitInDoubt)
	assert.Zero(t, hits.Load(), "nothing was sent")
	p.Refuse(0)
	return err
}

// Do through a journal whose intent's, then outcome's, acknowledgement is
// lost: Do answers what the journal holds, and the server sees the
// request once.
func TestDoWhoseJournalAcknowledgementIsLost(t *testing.T) {
	t.Parallel()
	for _, write := range []string{"intent", "outcome"} {
		t.Run(write, func(t *testing.T) {
			t.Parallel()
			p, j, direct := proxiedJournal(t)
			c, hits := clientOfACountingServer(t, j)

			match := commitsWrite
			if write == "outcome" {
				// The intent's commit passes; the next one is the outcome's.
				first := true
				match = func(m pgproxy.Message) bool {
					if !commitsWrite(m) {
						return false
					}
					if first {
						first = false
						return false
					}
					return true
				}
			}
			f := p.DropReply(match)
			res, err := c.Do(ctx, idem.Op{ID: "order-1", Method: http.MethodPost, URL: "/orders", Body: []byte(`{}`)})
			fired(t, f)
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, res.StatusCode)
			assert.EqualValues(t, 1, hits.Load())
			rec, err := direct.Lookup(ctx, "default", "order-1")
			require.NoError(t, err)
			assert.Equal(t, idem.StateSucceeded, rec.State, "Do's answer agrees with the journal")
		})
	}
}

// A lost acknowledgement that cannot be read back (the database is out of
// reach for a while): the write's error wraps ErrCommitInDoubt and names
// it; once the database answers again, the retried Do drives the
// operation under the client's own lease, which no call holds any more,
// instead of waiting for it to lapse (an hour here).
func TestDoWhoseIntentCannotBeReadBack(t *testing.T) {
	t.Parallel()
	p, j, direct := proxiedJournal(t)
	c, hits := clientOfACountingServer(t, j)
	op := idem.Op{ID: "order-2", Method: http.MethodPost, URL: "/orders", Body: []byte(`{}`)}

	err := doWithTheIntentsCommitInDoubt(t, p, c, hits, op)
	assert.Contains(t, err.Error(), "default/order-2", "the error names the operation")

	dctx, cancel := context.WithTimeout(ctx, time.Minute) // far less than the lease
	defer cancel()
	res, err := c.Do(dctx, op)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, res.StatusCode)
	assert.EqualValues(t, 1, hits.Load())
	rec, err := direct.Lookup(ctx, "default", "order-2")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
}

// A take-over of a stale lock whose acknowledgement is lost: the store
// reads it back, and the request holds the key.
func TestStoreTakeOverWhoseAcknowledgementIsLost(t *testing.T) {
	t.Parallel()
	p, pool := proxiedPool(t)
	schema := pgtest.Schema(t)
	s := openStoreIn(t, pool, schema)
	direct := openStoreIn(t, pgtest.Pool(t), schema)
	now := time.Now()
	first, err := direct.Claim(ctx, claimAt("k1", "fp", now.Add(-time.Hour)))
	require.NoError(t, err)
	require.True(t, first.Claimed)

	f := p.DropReply(pgproxy.Executes("UPDATE", "store_entries", "nextval"))
	req := claimAt("k1", "fp", now)
	req.StaleBefore = now.Add(-time.Minute)
	res, err := s.Claim(ctx, req)
	fired(t, f)
	require.NoError(t, err)
	assert.True(t, res.Claimed && res.TookOver, "the take-over committed: the key is this request's")
	e, err := direct.Get(ctx, "tenant", "k1", now)
	require.NoError(t, err)
	assert.Equal(t, e.Token, res.Token)
	assert.Greater(t, res.Token, first.Token)
}

// The same, taken up by Resume: once the database answers again, the
// client's Resume drives the operation under the client's own lease, which
// no call holds any more, instead of waiting for it to lapse (an hour).
func TestResumeOfAnIntentThatCannotBeReadBack(t *testing.T) {
	t.Parallel()
	p, j, direct := proxiedJournal(t)
	c, hits := clientOfACountingServer(t, j)
	op := idem.Op{ID: "order-3", Method: http.MethodPost, URL: "/orders", Body: []byte(`{}`)}

	doWithTheIntentsCommitInDoubt(t, p, c, hits, op)

	rctx, cancel := context.WithTimeout(ctx, time.Minute) // far less than the lease
	defer cancel()
	rep, err := c.Resume(rctx)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Succeeded, "Resume took up the operation under the client's own lease: %+v", rep)
	assert.EqualValues(t, 1, hits.Load())
	rec, err := direct.Lookup(ctx, "default", "order-3")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
}
