package redis_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/redis"
)

// A client pointed at a replica (a mistyped address, a Sentinel client
// with ReplicaOnly) must not open: a read-only replica fails every claim,
// and a writable one (replica-read-only no) takes claims that stay on it,
// where the master and the other replicas never see them, so that two API
// replicas on two Redis nodes both run the handler for one key.
func TestOpenRefusesAReplica(t *testing.T) {
	t.Parallel()
	master := startRedis(t, "--save", "", "--appendonly", "no")
	replica := startRedis(t, "--save", "", "--appendonly", "no", "--replica-read-only", "no",
		"--replicaof", "127.0.0.1", strconv.Itoa(master.port))
	c := newClient(t, replica.addr(), time.Second)
	require.Eventually(t, func() bool {
		info, err := c.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}, 20*time.Second, 50*time.Millisecond, "the replica is in sync")

	_, err := redis.Open(ctx, c, redis.Logger(quiet))
	require.ErrorIs(t, err, redis.ErrReplica)
	assert.Contains(t, err.Error(), "master", "the error says what to do")

	_, err = redis.Open(ctx, newClient(t, master.addr(), time.Second), redis.Logger(quiet))
	require.NoError(t, err, "the master opens")
}
