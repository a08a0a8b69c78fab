package orders_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/examples/server/orders"
	"github.com/idemkit/idem/server"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type api struct {
	t   *testing.T
	app *orders.App
	srv *httptest.Server
}

func newApp(t *testing.T) *orders.App {
	t.Helper()
	app, err := orders.New(filepath.Join(t.TempDir(), "orders.db"))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, app.Close()) })
	return app
}

// serve puts app behind a new middleware on a new memory store.
func serve(t *testing.T, app *orders.App) *api {
	t.Helper()
	mw, err := server.New(server.Config{Store: server.NewMemoryStore(), Scope: orders.Tenant})
	require.NoError(t, err)
	srv := httptest.NewServer(orders.Mux(app, mw))
	t.Cleanup(func() {
		srv.Close()
		assert.NoError(t, mw.Close())
	})
	return &api{t: t, app: app, srv: srv}
}

type reply struct {
	status int
	header http.Header
	body   string
}

func (a *api) do(method, path, key, tenant, body string) reply {
	a.t.Helper()
	req, err := http.NewRequest(method, a.srv.URL+path, strings.NewReader(body))
	require.NoError(a.t, err)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if tenant != "" {
		req.Header.Set(orders.TenantHeader, tenant)
	}
	resp, err := a.srv.Client().Do(req)
	require.NoError(a.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(a.t, err)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

func (a *api) count(tenant string) int {
	a.t.Helper()
	n, err := a.app.Orders(context.Background(), tenant)
	require.NoError(a.t, err)
	return n
}

func TestCreateOrder(t *testing.T) {
	t.Parallel()
	a := serve(t, newApp(t))
	r := a.do("POST", "/orders", "k1", "", `{"item":"book","quantity":2}`)
	require.Equal(t, http.StatusCreated, r.status, r.body)
	var o orders.Order
	require.NoError(t, json.Unmarshal([]byte(r.body), &o))
	assert.Equal(t, orders.Order{ID: "ord_1", Item: "book", Quantity: 2}, o)
	assert.Equal(t, "/orders/ord_1", r.header.Get("Location"))
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))

	r = a.do("POST", "/orders", "k2", "acme", `{"item":"pen","quantity":1}`)
	assert.Contains(t, r.body, `"order_id":"ord_2"`)
	assert.Equal(t, 1, a.count(orders.DefaultTenant), "no X-Tenant is the default tenant")
	assert.Equal(t, 1, a.count("acme"))
	total, err := a.app.TotalOrders(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, total)
	assert.Equal(t, 2, a.app.Executions())
	assert.Zero(t, a.app.GuardedDuplicates())
}

func TestRetryIsReplayedNotExecuted(t *testing.T) {
	t.Parallel()
	a := serve(t, newApp(t))
	first := a.do("POST", "/orders", "k", "acme", `{"item":"book","quantity":1}`)
	second := a.do("POST", "/orders", "k", "acme", `{"item":"book","quantity":1}`)
	assert.Equal(t, first.body, second.body)
	assert.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
	assert.Equal(t, 1, a.count("acme"))
	assert.Equal(t, 1, a.app.Executions())

	r := a.do("GET", "/idempotency/k", "", "acme", "")
	require.Equal(t, http.StatusOK, r.status)
	var s struct {
		State    string `json:"state"`
		Response struct {
			Body string `json:"body"`
		} `json:"response"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &s))
	assert.Equal(t, "completed", s.State)
	assert.Equal(t, first.body, s.Response.Body)

	r = a.do("GET", "/idempotency/k", "", "other", "")
	assert.Equal(t, http.StatusNotFound, r.status, "the status endpoint is scoped by tenant")
}

func TestInvalidOrdersAre400(t *testing.T) {
	t.Parallel()
	a := serve(t, newApp(t))
	for i, body := range []string{
		``, `not json`, `[]`, `{}`,
		`{"item":"","quantity":1}`,
		`{"item":"book"}`,
		`{"item":"book","quantity":0}`,
		`{"item":"book","quantity":1001}`,
		`{"item":"book","quantity":1.5}`,
		`{"item":"book","quantity":"1"}`,
		`{"item":"book","quantity":1,"price":3}`,
		`{"item":"book","quantity":1}{"item":"pen","quantity":1}`,
		`{"item":"` + strings.Repeat("x", orders.MaxItemLength+1) + `","quantity":1}`,
	} {
		r := a.do("POST", "/orders", "k"+string(rune('a'+i)), "", body)
		assert.Equal(t, http.StatusBadRequest, r.status, body)
		assert.Equal(t, "application/problem+json", r.header.Get("Content-Type"), body)
		var p struct {
			Type string `json:"type"`
		}
		if assert.NoError(t, json.Unmarshal([]byte(r.body), &p), body) {
			assert.Equal(t, orders.ProblemInvalidOrder, p.Type, body)
		}
	}
	assert.Zero(t, a.count(orders.DefaultTenant))
	r := a.do("POST", "/orders", "ok", "", `{"item":"`+strings.Repeat("x", orders.MaxItemLength)+`","quantity":1000}`)
	assert.Equal(t, http.StatusCreated, r.status, "the limits themselves are valid")
}

// TestUniqueKeyIsTheSecondGuard runs the handler twice for one key, as it
// would if the middleware's stored response were lost (here: a second
// middleware with an empty store in front of the same database).
func TestUniqueKeyIsTheSecondGuard(t *testing.T) {
	t.Parallel()
	app := newApp(t)
	before, after := serve(t, app), serve(t, app)
	first := before.do("POST", "/orders", "k", "acme", `{"item":"book","quantity":1}`)
	again := after.do("POST", "/orders", "k", "acme", `{"item":"book","quantity":1}`)
	assert.Equal(t, http.StatusCreated, again.status)
	assert.Empty(t, again.header.Get("Idempotent-Replayed"), "the handler really ran again")
	assert.Equal(t, first.body, again.body, "the re-execution answers with the existing order")
	assert.Equal(t, 1, before.count("acme"), "no second order")
	assert.Equal(t, 2, app.Executions())
	assert.Equal(t, 1, app.GuardedDuplicates())

	other := after.do("POST", "/orders", "k", "globex", `{"item":"book","quantity":1}`)
	assert.NotEqual(t, first.body, other.body, "the guard is per tenant")
	assert.Equal(t, 1, app.GuardedDuplicates())
}

func TestHandlerWithoutMiddlewareIs500(t *testing.T) {
	t.Parallel()
	app := newApp(t)
	rec := httptest.NewRecorder()
	app.Handler().ServeHTTP(rec, httptest.NewRequest("POST", "/orders", strings.NewReader(`{"item":"a","quantity":1}`)))
	assert.Equal(t, http.StatusInternalServerError, rec.Code)
	assert.Zero(t, app.GuardedDuplicates())
}

func TestNewRefusesAnotherProgramsFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys.db")
	s, err := server.OpenSQLiteStore(keys)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	_, err = orders.New(keys)
	require.ErrorIs(t, err, orders.ErrNotOrdersDatabase, "a key store is not an orders database")
	assert.Contains(t, err.Error(), keys, "the error names the file")

	other := filepath.Join(dir, "other.db")
	db, err := sql.Open("sqlite3", other)
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE customers (id INTEGER PRIMARY KEY)`)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	_, err = orders.New(other)
	require.ErrorIs(t, err, orders.ErrNotOrdersDatabase)

	text := filepath.Join(dir, "notes.txt")
	require.NoError(t, os.WriteFile(text, []byte("these are not the bytes of an SQLite database, not at all....."), 0o600))
	_, err = orders.New(text)
	require.Error(t, err)
	b, err := os.ReadFile(text)
	require.NoError(t, err)
	assert.Equal(t, "these are not the bytes of an SQLite database, not at all.....", string(b), "a foreign file is left as it was")
}

func TestDatabaseFileIsPrivateWALAndReopens(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "orders.db")
	app, err := orders.New(path)
	require.NoError(t, err)
	a := serve(t, app)
	a.do("POST", "/orders", "k", "acme", `{"item":"book","quantity":1}`)
	for _, p := range []string{path, path + "-wal"} {
		fi, err := os.Stat(p)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "%s is readable by its owner only", filepath.Base(p))
	}
	require.NoError(t, app.Close())

	db, err := sql.Open("sqlite3", path)
	require.NoError(t, err)
	defer db.Close()
	var mode string
	require.NoError(t, db.QueryRow(`PRAGMA journal_mode`).Scan(&mode))
	assert.Equal(t, "wal", mode)
	_, err = db.Exec(`INSERT INTO orders (tenant, idem_key, item, quantity) VALUES ('acme', 'k', 'pen', 1)`)
	require.Error(t, err, "UNIQUE (tenant, idem_key): the database itself refuses a second order for a key")

	again, err := orders.New(path)
	require.NoError(t, err, "an orders database reopens")
	defer again.Close()
	n, err := again.Orders(context.Background(), "acme")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
}
