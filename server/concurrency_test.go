package server_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/server"
)

// TestManyConcurrentRequestsWithOneKeyRunTheHandlerOnce sends 200 requests
// with one key at once. The one handler that runs is held until half the
// others have been answered, so that they really overlap it.
func TestManyConcurrentRequestsWithOneKeyRunTheHandlerOnce(t *testing.T) {
	t.Parallel()
	const n = 200
	for name, store := range map[string]func(*testing.T) server.Store{
		"memory": func(*testing.T) server.Store { return server.NewMemoryStore() },
		"sqlite": func(t *testing.T) server.Store { return openSQLite(t) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var answered atomic.Int64
			halfAnswered := make(chan struct{})
			e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
				<-halfAnswered
				created(w, r)
			}, withStore(store(t)))
			e.srv.Client().Transport.(*http.Transport).MaxIdleConnsPerHost = n

			var (
				wg      sync.WaitGroup
				start   = make(chan struct{})
				once    sync.Once
				mu      sync.Mutex
				byCode  = map[int]int{}
				bodies  = map[string]bool{}
				replays int
			)
			for range n {
				wg.Go(func() {
					<-start
					r, err := e.send(context.Background(), http.MethodPost, "/orders", `{"item":"book"}`, "Idempotency-Key", "hot")
					if !assert.NoError(t, err) {
						return
					}
					if answered.Add(1) == n/2 {
						once.Do(func() { close(halfAnswered) })
					}
					mu.Lock()
					defer mu.Unlock()
					byCode[r.Status]++
					switch r.Status {
					case http.StatusCreated:
						bodies[r.Body] = true
						if r.replayed() {
							replays++
						}
					case http.StatusConflict:
						p, ok := wire.ParseProblem(r.Header.Get("Content-Type"), []byte(r.Body))
						assert.True(t, ok)
						assert.Equal(t, wire.ProblemInProgress, p.Type)
					}
				})
			}
			close(start)
			wg.Wait()
			once.Do(func() { close(halfAnswered) })

			assert.EqualValues(t, 1, e.calls.Load(), "the handler must run exactly once")
			assert.Equal(t, n, byCode[http.StatusCreated]+byCode[http.StatusConflict], "every answer is the result or 409: %v", byCode)
			assert.GreaterOrEqual(t, byCode[http.StatusConflict], n/2, "the held handler overlapped at least half the requests")
			assert.Len(t, bodies, 1, "every 201 carries the same body")
			assert.Equal(t, byCode[http.StatusCreated]-1, replays, "every 201 but the first is a replay")
			r := e.post("/orders", "hot", `{"item":"book"}`)
			assert.True(t, r.replayed())
		})
	}
}

func TestManyConcurrentKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, created, withStore(openSQLite(t)))
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			key := "k" + string(rune('A'+i%26)) + string(rune('a'+i/26))
			r, err := e.send(context.Background(), http.MethodPost, "/orders", `{}`, "Idempotency-Key", key)
			if assert.NoError(t, err) {
				assert.Equal(t, http.StatusCreated, r.Status)
				assert.False(t, r.replayed())
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 100, e.calls.Load())
}
