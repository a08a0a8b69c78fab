package postgres_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/postgres/internal/pgtest"
	"github.com/idemkit/idem/server"
)

// replica is one instance of an API: its own pool, store and middleware
// on the shared schema, behind its own loopback server.
type replica struct {
	name string
	srv  *httptest.Server
}

func tenantOf(r *http.Request) string { return r.Header.Get("X-Tenant") }

// startReplicas starts n replicas of an API whose idempotent route runs h,
// every one on the same schema, with the status endpoint at
// /idempotency/{key}.
func startReplicas(t *testing.T, n int, h func(replica string) http.HandlerFunc) []*replica {
	t.Helper()
	schema := pgtest.Schema(t)
	out := make([]*replica, n)
	for i := range out {
		pool := pgtest.Pool(t)
		if i > 0 {
			pool = newPool(t)
		}
		store := openStoreIn(t, pool, schema)
		mw, err := server.New(server.Config{Store: store, Scope: tenantOf})
		require.NoError(t, err)
		name := fmt.Sprint("replica-", i)
		mux := http.NewServeMux()
		mux.Handle("POST /orders", mw.Handler(h(name)))
		mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
		srv := httptest.NewServer(mux)
		srv.Client().Transport.(*http.Transport).MaxIdleConnsPerHost = 256
		t.Cleanup(func() {
			srv.Close()
			assert.NoError(t, mw.Close())
		})
		out[i] = &replica{name: name, srv: srv}
	}
	return out
}

type answer struct {
	status int
	header http.Header
	body   string
}

func (r *replica) do(t *testing.T, method, path, tenant, key, body string) (answer, error) {
	req, err := http.NewRequest(method, r.srv.URL+path, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("X-Tenant", tenant)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := r.srv.Client().Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}, err
}

// TestReplicasRunAHandlerOncePerKey sends 100 requests with one key, at
// once, from each of two tenants, spread over two replicas of an API that
// share a postgres.Store. Each tenant's handler runs once, on one replica,
// and is held until half of all requests have been answered, so that the
// others really overlap it: every answer is that run's response or 409 in
// progress, and the key then replays on both replicas and reads completed
// on both status endpoints, each tenant seeing its own run only.
func TestReplicasRunAHandlerOncePerKey(t *testing.T) {
	t.Parallel()
	const perTenant = 100
	tenants := []string{"acme", "globex"}
	total := perTenant * len(tenants)
	var (
		calls    sync.Map // tenant → *atomic.Int64
		answered atomic.Int64
		half     = make(chan struct{})
		halfOnce sync.Once
	)
	openHalf := func() { halfOnce.Do(func() { close(half) }) }
	replicas := startReplicas(t, 2, func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			n, _ := calls.LoadOrStore(tenantOf(r), new(atomic.Int64))
			if n.(*atomic.Int64).Add(1) == 1 {
				// Only a tenant's first run waits: should the store let
				// a second one through, it answers at once and the test
				// fails on the count instead of hanging.
				<-half
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"tenant":%q,"ran_on":%q}`, tenantOf(r), name)
		}
	})
	t.Cleanup(openHalf) // before the servers close, should the test fail early

	type tally struct {
		byStatus map[int]int
		bodies   map[string]bool
		replays  int
	}
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		mu    sync.Mutex
		got   = map[string]*tally{}
	)
	for _, tenant := range tenants {
		got[tenant] = &tally{byStatus: map[int]int{}, bodies: map[string]bool{}}
		for i := range perTenant {
			wg.Go(func() {
				<-start
				a, err := replicas[i%2].do(t, http.MethodPost, "/orders", tenant, "order-42", `{"item":"book"}`)
				if answered.Add(1) == int64(total/2) {
					openHalf()
				}
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				g := got[tenant]
				g.byStatus[a.status]++
				switch a.status {
				case http.StatusCreated:
					g.bodies[a.body] = true
					if a.header.Get(wire.ReplayedHeader) == "true" {
						g.replays++
					}
				case http.StatusConflict:
					p, ok := wire.ParseProblem(a.header.Get("Content-Type"), []byte(a.body))
					assert.True(t, ok, "a 409 is a problem: %s", a.body)
					assert.Equal(t, wire.ProblemInProgress, p.Type)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	openHalf()

	conflicts := 0
	for _, tenant := range tenants {
		g := got[tenant]
		n, _ := calls.Load(tenant)
		require.NotNil(t, n, "tenant %s's handler never ran", tenant)
		assert.EqualValues(t, 1, n.(*atomic.Int64).Load(), "tenant %s's handler must run exactly once across the replicas", tenant)
		assert.Equal(t, perTenant, g.byStatus[http.StatusCreated]+g.byStatus[http.StatusConflict],
			"every answer to %s is its result or 409: %v", tenant, g.byStatus)
		require.Len(t, g.bodies, 1, "every 201 to %s carries the same body", tenant)
		for body := range g.bodies {
			assert.Contains(t, body, fmt.Sprintf(`"tenant":%q`, tenant), "a tenant sees its own run only")
		}
		assert.Equal(t, g.byStatus[http.StatusCreated]-1, g.replays, "every 201 to %s but the first is a replay", tenant)
		conflicts += g.byStatus[http.StatusConflict]
	}
	assert.GreaterOrEqual(t, conflicts, total/2, "the held handlers overlapped at least half the requests")

	for _, tenant := range tenants {
		for _, r := range replicas {
			a, err := r.do(t, http.MethodPost, "/orders", tenant, "order-42", `{"item":"book"}`)
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, a.status)
			assert.Equal(t, "true", a.header.Get(wire.ReplayedHeader), "%s replays %s's key", r.name, tenant)
			assert.True(t, got[tenant].bodies[a.body], "%s replays the one run's response", r.name)

			a, err = r.do(t, http.MethodGet, "/idempotency/order-42", tenant, "", "")
			require.NoError(t, err)
			s, body, err := wire.DecodeStatus(a.status, []byte(a.body), "order-42")
			require.NoError(t, err)
			assert.Equal(t, "completed", s.State, "%s's status endpoint", r.name)
			assert.True(t, got[tenant].bodies[string(body)], "the status endpoint gives the stored response")
		}
	}
}

// TestMiddlewareRunsWhatOtherStoresRun: requests that the memory and
// SQLite stores run (a path that decodes to a byte that is not UTF-8, or
// to a NUL; a scope that is not UTF-8 and as long as a JWT) run once and
// replay here too, instead of a 503 that the client would retry forever.
func TestMiddlewareRunsWhatOtherStoresRun(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("eyJzdWIiOiJ0ZW5hbnQifQ", 150)
	mw, err := server.New(server.Config{Store: openStore(t), Scope: func(r *http.Request) string {
		return r.Header.Get("X-Tenant") + "\xff" + long
	}})
	require.NoError(t, err)
	var runs atomic.Int64
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(func() {
		srv.Close()
		assert.NoError(t, mw.Close())
	})
	r := &replica{name: "replica", srv: srv}
	for i, path := range []string{"/files/caf%E9.txt", "/files/a%00b"} {
		key := fmt.Sprint("k", i)
		for try := range 2 {
			a, err := r.do(t, http.MethodPost, path, "t\xe9", key, `{}`)
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, a.status, "%s, try %d: %s", path, try+1, a.body)
		}
	}
	assert.EqualValues(t, 2, runs.Load(), "each request ran once")
}
