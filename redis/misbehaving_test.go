package redis_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/redis"
	"github.com/idemkit/idem/server"
)

// syncBuffer is a log destination safe for the middleware's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// api is the middleware on a store, in front of a handler that counts its
// runs, with the middleware's log kept.
type api struct {
	srv  *httptest.Server
	runs atomic.Int64
	log  *syncBuffer
}

func newAPI(t *testing.T, store server.Store, lockTimeout time.Duration) *api {
	a := &api{log: &syncBuffer{}}
	mw, err := server.New(server.Config{Store: store, Scope: server.SingleTenant, LockTimeout: lockTimeout,
		RetryAfter: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(a.log, nil))})
	require.NoError(t, err)
	a.srv = httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(func() { a.srv.Close(); _ = mw.Close() })
	return a
}

type answer struct {
	status      int
	problemType string
	replayed    bool
}

func (a *api) post(t *testing.T, key string) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, a.srv.URL+"/orders", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", key)
	resp, err := a.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var p struct{ Type string }
	_ = json.NewDecoder(resp.Body).Decode(&p)
	return answer{resp.StatusCode, p.Type, resp.Header.Get("Idempotent-Replayed") == "true"}
}

const problemStoreFailed = "urn:idem:problem:store-unavailable"

// requireStoreFailed checks that a is the middleware's 503 and that its
// log names the Redis store and says what happened.
func requireStoreFailed(t *testing.T, a *api, got answer, what string) {
	t.Helper()
	require.Equal(t, http.StatusServiceUnavailable, got.status)
	assert.Equal(t, problemStoreFailed, got.problemType)
	assert.Contains(t, a.log.String(), "redis store", "the log names the store")
	assert.Contains(t, a.log.String(), what)
}

func newClient(t testing.TB, addr string, readTimeout time.Duration) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 500 * time.Millisecond, ReadTimeout: readTimeout})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestUnreachableRedis(t *testing.T) {
	t.Parallel()
	proc := startRedis(t, "--save", "", "--appendonly", "no")
	c := newClient(t, proc.addr(), time.Second)

	_, err := redis.Open(ctx, newClient(t, "127.0.0.1:1", time.Second))
	require.ErrorIs(t, err, redis.ErrUnavailable, "Open refuses a Redis it cannot reach")
	assert.Contains(t, err.Error(), "check the client's address")

	a := newAPI(t, openStore(t, c), time.Minute)
	require.Equal(t, http.StatusCreated, a.post(t, "k1").status)
	proc.kill()
	requireStoreFailed(t, a, a.post(t, "k2"), "cannot be reached")
	assert.Equal(t, int64(1), a.runs.Load(), "nothing ran while Redis was gone")
}

// Redis busy with another client's long script: the claim gets no answer
// within the client's ReadTimeout, then runs once Redis is free. The
// request is answered 503; its retries get 409 while the claim it never
// heard of holds the key, and the handler runs once, after the lock lapses.
func TestTimeoutMidScript(t *testing.T) {
	t.Parallel()
	proc := startRedis(t, "--save", "", "--appendonly", "no", "--busy-reply-threshold", "5000")
	c := newClient(t, proc.addr(), 200*time.Millisecond)
	a := newAPI(t, openStore(t, c), 600*time.Millisecond)

	busy := goredis.NewClient(&goredis.Options{Addr: proc.addr(), ReadTimeout: 5 * time.Second})
	t.Cleanup(func() { _ = busy.Close() })
	started := make(chan struct{})
	go func() {
		close(started)
		_ = busy.Eval(context.Background(), `local t = tonumber(redis.call('TIME')[1]) while tonumber(redis.call('TIME')[1]) < t + 2 do end return 1`, nil).Err()
	}()
	<-started
	probe := newClient(t, proc.addr(), 50*time.Millisecond)
	require.Eventually(t, func() bool { return probe.Ping(ctx).Err() != nil }, 10*time.Second, 10*time.Millisecond,
		"the long script runs: Redis answers nobody")
	requireStoreFailed(t, a, a.post(t, "k"), "no answer in time")

	require.Eventually(t, func() bool { return a.post(t, "k").status == http.StatusCreated }, 20*time.Second, 50*time.Millisecond)
	assert.Equal(t, int64(1), a.runs.Load(), "the handler ran once")
	assert.True(t, a.post(t, "k").replayed)
}

// After a restart or SCRIPT FLUSH the server's script cache is empty: the
// store sends the script itself and carries on.
func TestNoScriptAfterFlush(t *testing.T) {
	t.Parallel()
	proc := startRedis(t, "--save", "", "--appendonly", "no")
	c := newClient(t, proc.addr(), time.Second)
	a := newAPI(t, openStore(t, c), time.Minute)
	require.Equal(t, http.StatusCreated, a.post(t, "k1").status)
	require.NoError(t, c.ScriptFlush(ctx).Err())
	require.Equal(t, http.StatusCreated, a.post(t, "k2").status)
	require.NoError(t, c.ScriptFlush(ctx).Err())
	assert.True(t, a.post(t, "k1").replayed)
	assert.Equal(t, int64(2), a.runs.Load())
}

func TestOutOfMemory(t *testing.T) {
	t.Parallel()
	proc := startRedis(t, "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction")
	c := newClient(t, proc.addr(), time.Second)
	a := newAPI(t, openStore(t, c), time.Minute)
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err())
	requireStoreFailed(t, a, a.post(t, "k"), "out of memory")
	assert.Zero(t, a.runs.Load(), "nothing ran")
	assert.Zero(t, c.DBSize(ctx).Val(), "the refused claim wrote nothing")
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())
	require.Equal(t, http.StatusCreated, a.post(t, "k").status)
	assert.True(t, a.post(t, "k").replayed)
}

func TestOpenRefusesAnEvictingPolicy(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"allkeys-lru", "volatile-ttl"} {
		proc := startRedis(t, "--save", "", "--appendonly", "no", "--maxmemory-policy", policy)
		c := newClient(t, proc.addr(), time.Second)
		_, err := redis.Open(ctx, c, redis.Logger(quiet))
		require.ErrorIs(t, err, redis.ErrEvicts, policy)
		assert.Contains(t, err.Error(), "noeviction", "the error says what to do")
		s, err := redis.Open(ctx, c, redis.Logger(quiet), redis.AllowEviction())
		require.NoError(t, err, "AllowEviction accepts %s", policy)
		assert.Equal(t, policy, s.Durability().EvictionPolicy)
	}
}

func TestOpenSaysWhatACrashCosts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args    []string
		durable bool
		says    string
	}{
		{[]string{"--appendonly", "no", "--save", ""}, false, "appendonly no"},
		{[]string{"--appendonly", "yes", "--appendfsync", "everysec", "--save", ""}, false, "about the last second"},
		{[]string{"--appendonly", "yes", "--appendfsync", "always", "--save", ""}, true, "loses none"},
		{[]string{"--appendonly", "yes", "--save", "", "--rename-command", "CONFIG", ""}, false, "does not say"},
	} {
		proc := startRedis(t, tc.args...)
		c := newClient(t, proc.addr(), time.Second)
		var log syncBuffer
		s, err := redis.Open(ctx, c, redis.Logger(slog.New(slog.NewTextHandler(&log, nil))))
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(log.String()), "\n")
		require.Len(t, lines, 1, "one line")
		assert.Contains(t, lines[0], tc.says)
		assert.Equal(t, tc.durable, s.Durability().Durable())

		_, err = redis.Open(ctx, c, redis.Logger(quiet), redis.RequireDurable())
		if tc.durable {
			require.NoError(t, err)
		} else {
			require.ErrorIs(t, err, redis.ErrNotDurable, "RequireDurable with %v", tc.args)
			assert.Contains(t, err.Error(), "appendfsync always", "the error says what to set")
		}
	}
}

func TestOpenRefusesBadArguments(t *testing.T) {
	t.Parallel()
	_, err := redis.Open(ctx, nil)
	require.ErrorContains(t, err, "needs a client")
	c := machineClient(t)
	_, err = redis.Open(ctx, c, redis.Prefix("a{b}"))
	require.ErrorContains(t, err, "brace")
	_, err = redis.Open(ctx, c, redis.WithClock("sundial"))
	require.ErrorContains(t, err, "unknown Clock")
	_, err = redis.Open(ctx, c, redis.WaitReplicas(1, 0))
	require.ErrorContains(t, err, "positive timeout")
}

// Through the autopipeliner, a flushed script cache and a Redis gone get
// the answers they get without it.
func TestAutoPipelineNoScriptAndUnreachable(t *testing.T) {
	t.Parallel()
	proc := startRedis(t, "--save", "", "--appendonly", "no")
	c := newClient(t, proc.addr(), time.Second)
	a := newAPI(t, openStore(t, c, redis.AutoPipeline()), time.Minute)
	require.Equal(t, http.StatusCreated, a.post(t, "k1").status)
	require.NoError(t, c.ScriptFlush(ctx).Err())
	require.Equal(t, http.StatusCreated, a.post(t, "k2").status)
	require.NoError(t, c.ScriptFlush(ctx).Err())
	assert.True(t, a.post(t, "k1").replayed)
	assert.Equal(t, int64(2), a.runs.Load())

	proc.kill()
	requireStoreFailed(t, a, a.post(t, "k3"), "cannot be reached")
	assert.Equal(t, int64(2), a.runs.Load(), "nothing ran while Redis was gone")
}
