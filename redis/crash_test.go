package redis_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
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

// crashRun is a middleware on a store on a redis-server child, with a
// handler that counts its runs per key in the test's own memory, which a
// crash of Redis does not touch.
type crashRun struct {
	srv  *httptest.Server
	mu   sync.Mutex
	runs map[string]int
}

func newCrashRun(t *testing.T, store *redis.Store) *crashRun {
	r := &crashRun{runs: map[string]int{}}
	mw, err := server.New(server.Config{Store: store, Scope: server.SingleTenant,
		LockTimeout: 2 * time.Second, RetryAfter: 50 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)
	r.srv = httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		key, _ := server.KeyFromContext(req.Context())
		r.mu.Lock()
		r.runs[key]++
		r.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(key))
	})))
	t.Cleanup(func() { r.srv.Close(); _ = mw.Close() })
	return r
}

// send posts key once and returns the status and whether it was replayed.
func (r *crashRun) send(key string) (int, bool, error) {
	req, _ := http.NewRequest(http.MethodPost, r.srv.URL+"/orders", strings.NewReader(`{"n":1}`))
	req.Header.Set("Idempotency-Key", key)
	resp, err := r.srv.Client().Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", nil
}

// crashFigures is what one run counted.
type crashFigures struct {
	answered, reran, checked int
	duration                 time.Duration
}

// runCrash sends keys from several workers, each key until it is answered
// 201, SIGKILLs Redis once answers have begun and restarts it, then sends
// every answered key once more and counts the handlers that ran again.
func runCrash(t *testing.T, proc *redisProc, opts ...redis.Option) crashFigures {
	client := goredis.NewClient(&goredis.Options{Addr: proc.addr(), MaxRetries: -1,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = client.Close() })
	store, err := redis.Open(ctx, client, append([]redis.Option{redis.Logger(quiet)}, opts...)...)
	require.NoError(t, err)
	run := newCrashRun(t, store)

	total, workers := 400, 8
	if v, _ := strconv.Atoi(os.Getenv("IDEM_REDIS_CRASH_KEYS")); v > 0 {
		total = v
	}
	var (
		next     atomic.Int64
		answered sync.Map
		count    atomic.Int64
		wg       sync.WaitGroup
	)
	killed := make(chan struct{})
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(total) {
					return
				}
				key := fmt.Sprintf("crash-%d", i)
				for {
					status, _, err := run.send(key)
					if err == nil && status == http.StatusCreated {
						answered.Store(key, true)
						count.Add(1)
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
	go func() {
		for count.Load() < int64(total/3) {
			time.Sleep(time.Millisecond)
		}
		proc.kill()
		time.Sleep(100 * time.Millisecond) // requests meet a Redis that is gone
		proc.start()
		close(killed)
	}()
	wg.Wait()
	<-killed
	f := crashFigures{duration: time.Since(start)}

	// Every answered key once more: replayed, or run again.
	answered.Range(func(k, _ any) bool {
		f.answered++
		for {
			status, _, err := run.send(k.(string))
			if err == nil && status == http.StatusCreated {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		return true
	})
	run.mu.Lock()
	defer run.mu.Unlock()
	for _, n := range run.runs {
		f.checked++
		if n > 1 {
			f.reran++
		}
	}
	return f
}

// With appendonly yes and appendfsync always, a Redis SIGKILLed and
// restarted under load loses nothing it acknowledged: no handler runs
// twice for any key. The same run on a Redis that keeps nothing on disk
// shows the re-runs, so the test is seen to bite. IDEM_REDIS_CRASH_KEYS
// makes the run longer.
func TestCrashOfRedis(t *testing.T) {
	t.Parallel()
	t.Run("Durable", func(t *testing.T) {
		t.Parallel()
		proc := startRedis(t, "--appendonly", "yes", "--appendfsync", "always", "--save", "")
		f := runCrash(t, proc, redis.RequireDurable())
		t.Logf("appendfsync always: %d keys answered, %d ran again, in %s", f.answered, f.reran, f.duration.Round(time.Millisecond))
		assert.Zero(t, f.reran, "a handler ran twice for a key that was answered")
		assert.Equal(t, f.answered, f.checked)
	})
	t.Run("NothingOnDisk", func(t *testing.T) {
		t.Parallel()
		proc := startRedis(t, "--appendonly", "no", "--save", "")
		f := runCrash(t, proc)
		t.Logf("no persistence: %d keys answered, %d ran again, in %s", f.answered, f.reran, f.duration.Round(time.Millisecond))
		assert.Positive(t, f.reran, "without persistence the restart must lose answered keys, and their retries run again")
	})
}
