package redis_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/redis"
	"github.com/idemkit/idem/server"
)

// A master of a Cluster (three masters, one replica each) is SIGKILLed:
// while its replica is promoted, every call on its keys either works or
// fails with ErrUnavailable (the middleware's 503); afterwards a key
// completed before the kill, once its replica had it, is still completed.
//
// The client's periodic reload of the slot map is set to an hour, so that
// only the store's own request for a reload, after a failure, can make the
// client find the promoted replica within the test's 45 s.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	nodes, addrs := createCluster(t, 6, 1, "1000")
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, ClusterStateReloadInterval: time.Hour,
		ReadTimeout: 500 * time.Millisecond, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = cc.Close() })
	require.Eventually(t, func() bool {
		var n atomic.Int64
		_ = cc.ForEachShard(ctx, func(ctx context.Context, c *goredis.Client) error {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				n.Add(1)
			}
			return nil
		})
		return n.Load() == 6
	}, 30*time.Second, 100*time.Millisecond, "the cluster's state is ok on every node")

	s := openStore(t, cc)
	res, err := s.Claim(ctx, claimAt("t", "before", time.Now(), time.Minute))
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, server.CompleteRequest{Scope: "t", Key: "before", Token: res.Token,
		Response: &server.StoredResponse{Status: 201, Body: []byte("kept")}, ExpiresAt: time.Now().Add(time.Hour)}))
	key := redis.Key(s.Prefix(), "t", "before")
	master, err := cc.MasterForKey(ctx, key)
	require.NoError(t, err)
	// The replica has the completion before its master dies.
	require.Eventually(t, func() bool { return master.Do(ctx, "WAIT", 1, 100).Val() == int64(1) }, 10*time.Second, 10*time.Millisecond)
	var victim *redisProc
	for _, n := range nodes {
		if n.addr() == master.Options().Addr {
			victim = n
		}
	}
	require.NotNil(t, victim)
	victim.kill()
	killed := time.Now()

	var (
		unavailable int
		other       error
		e           server.Entry
	)
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		e, err = s.Get(cctx, "t", "before", time.Now())
		cancel()
		if err == nil {
			break
		}
		if !errors.Is(err, redis.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
			other = err
			break
		}
		unavailable++
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(t, other, "a failure during the fail-over that is not ErrUnavailable")
	require.NoError(t, err, "the replica is promoted, and the client sees it, within 45 s")
	assert.Equal(t, server.Completed, e.State)
	assert.Equal(t, "kept", string(e.Response.Body), "the promoted replica holds the completion")
	t.Logf("%d reads failed with ErrUnavailable during the fail-over; the first read succeeded %s after the kill",
		unavailable, time.Since(killed).Round(time.Millisecond))
	assert.Positive(t, unavailable, "the kill was seen")
	res, err = s.Claim(ctx, claimAt("t", "before", time.Now(), time.Minute))
	require.NoError(t, err)
	assert.False(t, res.Claimed, "the completed key is replayed, not run again")
}
