package redis_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/redis"
	"github.com/idemkit/idem/server"
)

// With WaitReplicas a completion returns once the replica has it; with the
// replica gone it fails, saying so, although the master keeps it.
func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	master := startRedis(t, "--save", "", "--appendonly", "no")
	replica := startRedis(t, "--save", "", "--appendonly", "no", "--replicaof", "127.0.0.1", strconv.Itoa(master.port))
	c := newClient(t, master.addr(), 2*time.Second)
	require.Eventually(t, func() bool {
		info, err := c.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online")
	}, 20*time.Second, 50*time.Millisecond, "the replica is in sync")

	s := openStore(t, c, redis.WaitReplicas(1, 500*time.Millisecond))
	assert.Equal(t, 1, s.Durability().Replicas)
	complete := func(key string) error {
		res, err := s.Claim(ctx, claimAt("t", key, time.Now(), time.Minute))
		require.NoError(t, err)
		require.True(t, res.Claimed)
		return s.Complete(ctx, server.CompleteRequest{Scope: "t", Key: key, Token: res.Token,
			Response: &server.StoredResponse{Status: 201, Body: []byte(key)}, ExpiresAt: time.Now().Add(time.Hour)})
	}
	require.NoError(t, complete("k1"))
	rc := newClient(t, replica.addr(), time.Second)
	assert.Equal(t, "k1", rc.HGet(ctx, redis.Key(s.Prefix(), "t", "k1"), "rb").Val(), "the replica has the completion")

	replica.kill()
	err := complete("k2")
	require.ErrorIs(t, err, redis.ErrUnavailable)
	assert.Contains(t, err.Error(), "0 of the 1 replicas")
	e, err := s.Get(ctx, "t", "k2", time.Now())
	require.NoError(t, err)
	assert.Equal(t, server.Completed, e.State, "the master holds the completion; a retry of the key is replayed")
}
