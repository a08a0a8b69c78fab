package redis

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A client that lost the reply to a script may send it again (go-redis
// does, on some errors): the same call, same nonce, recognises its own
// effect, where a new call is refused.
func TestACallSentTwiceRecognisesItself(t *testing.T) {
	ctx := context.Background()
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Skipf("no Redis answers at 127.0.0.1:6379: %v", err)
	}
	key := []string{Key("idemtest:"+nonce()+":", "t", "k")}
	defer c.Del(ctx, key[0])

	ls, ln := seconds(time.Minute)
	rs, rn := seconds(time.Hour)
	claim := []any{string(ServerClock), "fp", http.MethodPost, "/orders", nonce(), ls, ln, rs, rn}
	first, err := claimScript.Run(ctx, c, key, claim...).Slice()
	require.NoError(t, err)
	require.Equal(t, "new", first[0])
	again, err := claimScript.Run(ctx, c, key, claim...).Slice()
	require.NoError(t, err)
	assert.Equal(t, "mine", again[0], "the same claim sent again is still the caller's")
	assert.Equal(t, first[3], again[3], "with the same token")
	claim[4] = nonce()
	other, err := claimScript.Run(ctx, c, key, claim...).Slice()
	require.NoError(t, err)
	assert.Equal(t, "seen", other[0], "another claim sees the lock")

	token, err := strconv.ParseInt(first[3].(string), 10, 64)
	require.NoError(t, err)
	complete := []any{string(ServerClock), strconv.FormatInt(token, 10), nonce(), rs, rn, 201, "", "body"}
	for i := range 2 {
		reply, err := completeScript.Run(ctx, c, key, complete...).Text()
		require.NoError(t, err)
		assert.Equal(t, "ok", reply, "sending %d of one completion", i+1)
	}
	complete[2] = nonce()
	reply, err := completeScript.Run(ctx, c, key, complete...).Text()
	require.NoError(t, err)
	assert.Equal(t, "ok", reply, "a second completion with the same token and response is the same completion")
	complete[2], complete[7] = nonce(), "another body"
	reply, err = completeScript.Run(ctx, c, key, complete...).Text()
	require.NoError(t, err)
	assert.Equal(t, "lost", reply, "a second completion with another response is refused")
}
