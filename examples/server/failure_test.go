package main

// What the pattern does when the key store fails after the handler ran:
// the order exists, its response is not stored yet. Both tests build the
// API from the same public pieces as run, on a key store that fails on
// command.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/server/orders"
	"github.com/idemkit/idem/server"
)

// failingStore is a real key store whose Complete (storing a handler's
// response) fails while failing is set, as on a disk hiccup or a lost
// connection to the store.
type failingStore struct {
	server.Store
	failing   atomic.Bool
	completes atomic.Int64
}

func (s *failingStore) Complete(ctx context.Context, req server.CompleteRequest) error {
	s.completes.Add(1)
	if s.failing.Load() {
		return errors.New("injected: the key store is unreachable")
	}
	return s.Store.Complete(ctx, req)
}

// shop is the orders API of run on files in dir, on a key store that fails
// on command.
type shop struct {
	t      *testing.T
	app    *orders.App
	store  *failingStore
	mw     *server.Middleware
	srv    *httptest.Server
	status atomic.Int64 // status requests answered
	// healOnStatus makes the key store work again once a status request
	// has been answered.
	healOnStatus atomic.Bool
}

func startShop(t *testing.T, dir string, keys *server.SQLiteStore, cfg server.Config) *shop {
	t.Helper()
	app, err := orders.New(filepath.Join(dir, "orders.db"))
	require.NoError(t, err)
	s := &shop{t: t, app: app, store: &failingStore{Store: keys}}
	cfg.Store, cfg.Scope = s.store, orders.Tenant
	s.mw, err = server.New(cfg)
	require.NoError(t, err)
	api := orders.Mux(app, s.mw)
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		api.ServeHTTP(w, r)
		if strings.HasPrefix(r.URL.Path, "/idempotency/") {
			s.status.Add(1)
			if s.healOnStatus.Load() {
				s.store.failing.Store(false)
			}
		}
	}))
	t.Cleanup(s.stop)
	return s
}

// stop ends the shop's process as far as the key store can tell: nothing
// of it renews a lock or stores a response any more.
func (s *shop) stop() {
	s.srv.Close()
	assert.NoError(s.t, s.mw.Close())
	assert.NoError(s.t, s.app.Close())
}

func (s *shop) orders() int {
	s.t.Helper()
	n, err := s.app.TotalOrders(context.Background())
	require.NoError(s.t, err)
	return n
}

func openKeys(t *testing.T, dir string) *server.SQLiteStore {
	t.Helper()
	keys, err := server.OpenSQLiteStore(filepath.Join(dir, "keys.db"))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, keys.Close()) })
	return keys
}

// TestStoreFailureAfterTheOrderIsOneSuccessForTheClient: the key store
// fails between the handler's return and the stored response, and recovers
// only after the client asked the status endpoint. An idem client,
// through its public API, gets one success; the orders table, under its
// UNIQUE guard, holds one order; the handler ran once.
func TestStoreFailureAfterTheOrderIsOneSuccessForTheClient(t *testing.T) {
	dir := t.TempDir()
	s := startShop(t, dir, openKeys(t, dir), server.Config{})
	s.store.failing.Store(true)
	s.healOnStatus.Store(true) // once the client has been told "processing"

	j, err := idem.OpenSQLite(filepath.Join(dir, "ops.db"))
	require.NoError(t, err)
	defer j.Close()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: s.srv.URL, Status: idem.StatusEndpoint(s.srv.URL + "/idempotency")})
	require.NoError(t, err)
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := c.Do(ctx, idem.Op{ID: "checkout/cart-7", Method: http.MethodPost, URL: "/orders", Body: []byte(`{"item":"book","quantity":1}`)})
	require.NoError(t, err, "one success")
	assert.Equal(t, http.StatusCreated, res.StatusCode)
	assert.Contains(t, string(res.Body), `"order_id":"ord_1"`)

	assert.GreaterOrEqual(t, s.store.completes.Load(), int64(2), "storing the response failed, then succeeded")
	assert.GreaterOrEqual(t, s.status.Load(), int64(1), "the client asked the status endpoint instead of sending again")
	assert.Equal(t, 1, s.orders(), "one order")
	assert.Equal(t, 1, s.app.Executions(), "the handler ran once")
	assert.Zero(t, s.app.GuardedDuplicates())
}

// TestUnstoredResponseAfterTheProcessStopsRunsAgainIntoTheUniqueGuard: the
// server stops before it could store the response (Close ends its
// retrying, as a crash would), leaving the key in progress. Once its lock
// is stale the next request with the key runs the handler again, and the
// orders table's UNIQUE (tenant, idem_key) guard answers it with the order
// the first run created: still one order.
func TestUnstoredResponseAfterTheProcessStopsRunsAgainIntoTheUniqueGuard(t *testing.T) {
	dir := t.TempDir()
	keys := openKeys(t, dir)
	first := startShop(t, dir, keys, server.Config{})
	first.store.failing.Store(true)
	const key, order = "5b0d6c8e-1f2a-4b3c-9d4e-0a1b2c3d4e5f", `{"item":"book","quantity":1}`
	post := func(s *shop) (int, http.Header, string) {
		req, err := http.NewRequest(http.MethodPost, s.srv.URL+"/orders", strings.NewReader(order))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", key)
		resp, err := s.srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header, string(b)
	}
	code, _, _ := post(first)
	require.Equal(t, http.StatusConflict, code, "the response could not be stored: the key is in progress")
	require.Equal(t, 1, first.orders(), "the order was created")
	first.stop()

	// The restarted server judges the dead run's lock stale after its own
	// LockTimeout.
	again := startShop(t, dir, keys, server.Config{LockTimeout: 300 * time.Millisecond})
	require.Eventually(t, func() bool {
		resp, err := again.srv.Client().Get(again.srv.URL + "/idempotency/" + key)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return err == nil && decodeStatus(t, string(b)).State == "not_found"
	}, 30*time.Second, 10*time.Millisecond, "the stopped run's lock goes stale")

	code, h, body := post(again)
	assert.Equal(t, http.StatusCreated, code)
	assert.Empty(t, h.Get("Idempotent-Replayed"), "the handler ran again")
	assert.Contains(t, body, `"order_id":"ord_1"`, "and answered with the first run's order")
	assert.Equal(t, 1, again.orders(), "one order")
	assert.Equal(t, 1, again.app.GuardedDuplicates(), "the UNIQUE guard caught the second run")
	_, h, replay := post(again)
	assert.Equal(t, "true", h.Get("Idempotent-Replayed"))
	assert.Equal(t, body, replay)
}
