package redis_test

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/redis"
	"github.com/idemkit/idem/server"
	"github.com/idemkit/idem/server/storetest"
)

// createCluster starts n redis-server children of the test with cluster
// mode on and joins them into one cluster with `redis-cli --cluster
// create`, replicas replicas per master; nodeTimeout is in milliseconds.
func createCluster(t *testing.T, n, replicas int, nodeTimeout string) ([]*redisProc, []string) {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Skip("redis-cli is not installed: the test builds a cluster with it")
	}
	var nodes []*redisProc
	var addrs []string
	for range n {
		p := startRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", nodeTimeout, "--save", "", "--appendonly", "no")
		nodes = append(nodes, p)
		addrs = append(addrs, p.addr())
	}
	out, err := exec.Command("redis-cli", append(append([]string{"--cluster", "create"}, addrs...),
		"--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")...).CombinedOutput()
	require.NoError(t, err, "redis-cli --cluster create: %s", out)
	return nodes, addrs
}

// startCluster starts a Redis Cluster of three masters, children of the
// test, and returns a client of it and its nodes.
func startCluster(t *testing.T) (*goredis.ClusterClient, []*redisProc) {
	t.Helper()
	nodes, addrs := createCluster(t, 3, 0, "2000")
	for _, n := range nodes {
		c := goredis.NewClient(&goredis.Options{Addr: n.addr()})
		require.Eventually(t, func() bool {
			info, err := c.ClusterInfo(context.Background()).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok")
		}, 20*time.Second, 50*time.Millisecond, "the cluster's state is ok on %s", n.addr())
		_ = c.Close()
	}
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = cc.Close() })
	return cc, nodes
}

func TestCluster(t *testing.T) {
	t.Parallel()
	cc, nodes := startCluster(t)

	t.Run("Suite", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) server.Store { return openStore(t, cc, redis.WithClock(redis.CallerClock)) })
	})

	// The entry's slot moves to another master between the claim and the
	// completion: the client follows the MOVED, and the completion holds.
	t.Run("SlotMovesUnderAClaim", func(t *testing.T) {
		s := openStore(t, cc)
		res, err := s.Claim(ctx, claimAt("t", "moving", time.Now(), time.Minute))
		require.NoError(t, err)
		require.True(t, res.Claimed)
		key := redis.Key(s.Prefix(), "t", "moving")
		moveSlot(t, cc, nodes, key)
		require.NoError(t, s.Renew(ctx, "t", "moving", res.Token, time.Now()))
		require.NoError(t, s.Complete(ctx, server.CompleteRequest{Scope: "t", Key: "moving", Token: res.Token,
			Response: &server.StoredResponse{Status: 201, Body: []byte("done")}, ExpiresAt: time.Now().Add(time.Hour)}))
		e, err := s.Get(ctx, "t", "moving", time.Now())
		require.NoError(t, err)
		assert.Equal(t, server.Completed, e.State)
		assert.Equal(t, "done", string(e.Response.Body))
	})
}

// moveSlot moves the slot of key, with its keys, from its master to
// another, as a resharding does, behind the client's back.
func moveSlot(t *testing.T, cc *goredis.ClusterClient, nodes []*redisProc, key string) {
	t.Helper()
	clients := map[string]*goredis.Client{}
	ids := map[string]string{}
	for _, n := range nodes {
		c := goredis.NewClient(&goredis.Options{Addr: n.addr()})
		t.Cleanup(func() { _ = c.Close() })
		clients[n.addr()] = c
		id, err := c.Do(ctx, "CLUSTER", "MYID").Text()
		require.NoError(t, err)
		ids[n.addr()] = id
	}
	slot, err := clients[nodes[0].addr()].ClusterKeySlot(ctx, key).Result()
	require.NoError(t, err)
	var from, to string
	for _, n := range nodes {
		if clients[n.addr()].ClusterCountKeysInSlot(ctx, int(slot)).Val() > 0 {
			from = n.addr()
		}
	}
	require.NotEmpty(t, from, "the key's master")
	for _, n := range nodes {
		if n.addr() != from {
			to = n.addr()
			break
		}
	}
	src, dst := clients[from], clients[to]
	require.NoError(t, dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from]).Err())
	require.NoError(t, src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to]).Err())
	keys, err := src.ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
	require.NoError(t, err)
	host, port, _ := strings.Cut(to, ":")
	args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	require.NoError(t, src.Do(ctx, args...).Err())
	for _, c := range clients {
		require.NoError(t, c.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[to]).Err())
	}
	require.Equal(t, int64(1), dst.Exists(ctx, key).Val(), "the key now lives on %s", to)
	// cc's slot map is stale: its next command on the key gets MOVED.
}
