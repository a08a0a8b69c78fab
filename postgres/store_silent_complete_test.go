package postgres_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres/internal/pgtest"
	"github.com/idemkit/idem/server"
)

// TestASilentSessionUnderTheResponsesCompleteDoesNotRunTheHandlerTwice:
// the middleware stores a handler's response on the PostgreSQL store, and
// the session that Complete draws from the pool has gone silent (a NAT or
// firewall forgot it: nothing comes back, no reset), while the database
// and every new session are fine. The middleware's first Complete runs
// under the request's context without its cancelation and without a
// deadline, and holds the heartbeat's lock while it waits: it waits for
// good, no renewal can run, the client hears nothing, and once LockTimeout
// passes the next request with the key takes the key over and runs the
// handler a second time, the store reachable all along. A Complete bounded
// as storeLater's are would fail, answer 409, and store the response on
// another session: the retry gets the replay, and the handler runs once.
func TestASilentSessionUnderTheResponsesCompleteDoesNotRunTheHandlerTwice(t *testing.T) {
	t.Parallel()
	p, pool := proxiedPoolOf(t, 4)
	store := openStoreIn(t, pool, pgtest.Schema(t))

	const lockTimeout = 3 * time.Second
	mw, err := server.New(server.Config{Store: store, Scope: server.SingleTenant, LockTimeout: lockTimeout})
	require.NoError(t, err)
	t.Cleanup(func() { _ = mw.Close() })
	var runs atomic.Int64
	entered, open := make(chan struct{}), make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(entered)
			<-open
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "order 1")
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	// Cut before the server closes: the silenced sessions then fail at once,
	// and the requests that wait on them end.
	t.Cleanup(p.CutAll)
	post := func(ctx context.Context) (int, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := srv.Client().Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}

	firstCtx, cancelFirst := context.WithCancel(ctx)
	t.Cleanup(cancelFirst)
	first := make(chan int, 1)
	go func() { code, _, _ := post(firstCtx); first <- code }()
	<-entered
	pids := p.BackendPIDs()
	require.NotEmpty(t, pids)
	for _, pid := range pids {
		p.Blackhole(pid) // the pool's idle sessions: Complete draws one
	}
	close(open)

	// The retry, until it is answered with anything but 409 in progress,
	// or the handler ran again (the bound is for a failing run, not a
	// measure: the lock goes stale after lockTimeout), each try given up
	// after lockTimeout.
	var code int
	var body string
	require.Eventually(t, func() bool {
		rctx, cancel := context.WithTimeout(ctx, lockTimeout)
		defer cancel()
		c, b, err := post(rctx)
		code, body = c, b
		t.Logf("retry: %d %v; runs so far: %d", c, err, runs.Load())
		return (err == nil && c != http.StatusConflict) || runs.Load() > 1
	}, 10*lockTimeout, 50*time.Millisecond)
	assert.EqualValues(t, 1, runs.Load(), "the handler ran once for the key; the retry got %d %q", code, body)
	assert.Equal(t, http.StatusCreated, code)
	select {
	case c := <-first:
		t.Logf("the first request was answered %d", c)
	default:
		assert.Fail(t, "the first request is still waiting for an answer after the retry was answered")
	}
}
