package server_test

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

func TestNewNamesTheBadField(t *testing.T) {
	t.Parallel()
	store := server.NewMemoryStore()
	one := server.SingleTenant
	for _, tc := range []struct {
		field string
		cfg   server.Config
	}{
		{"Store", server.Config{}},
		{"Scope", server.Config{Store: store}},
		{"Methods", server.Config{Store: store, Scope: one, Methods: []string{"PO ST"}}},
		{"Header", server.Config{Store: store, Scope: one, Header: "Idempotency Key"}},
		{"MaxKeyLength", server.Config{Store: store, Scope: one, MaxKeyLength: -1}},
		{"Retention", server.Config{Store: store, Scope: one, Retention: -time.Hour}},
		{"Retention", server.Config{Store: store, Scope: one, Retention: time.Minute, LockTimeout: time.Minute}},
		{"LockTimeout", server.Config{Store: store, Scope: one, LockTimeout: -1}},
		{"RetryAfter", server.Config{Store: store, Scope: one, RetryAfter: -1}},
		{"SweepInterval", server.Config{Store: store, Scope: one, SweepInterval: -1}},
		{"StorePolicy", server.Config{Store: store, Scope: one, StorePolicy: 7}},
		{"MaxBodyBytes", server.Config{Store: store, Scope: one, MaxBodyBytes: -1}},
	} {
		mw, err := server.New(tc.cfg)
		require.Error(t, err, tc.field)
		assert.Nil(t, mw)
		var ce *server.ConfigError
		require.True(t, errors.As(err, &ce), tc.field)
		assert.Equal(t, tc.field, ce.Field)
		assert.True(t, strings.HasPrefix(err.Error(), "idem server: Config."+tc.field+": "), err.Error())
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	g := newGate()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) { g.wait() })
	go e.send(t.Context(), http.MethodPatch, "/orders", "{}", "Idempotency-Key", "k") //nolint:errcheck
	g.waitEntered(t)
	r := e.do(http.MethodPatch, "/orders", "{}", "Idempotency-Key", "k")
	assert.Equal(t, http.StatusConflict, r.Status, "PATCH is idempotent by default")
	assert.Equal(t, "1", r.Header.Get("Retry-After"), "RetryAfter defaults to 1 s")
	g.release()
	big := strings.Repeat("x", server.DefaultMaxBodyBytes+1)
	assert.Equal(t, http.StatusRequestEntityTooLarge, e.post("/orders", "big", big).Status, "the body limit defaults to 1 MiB")
}

func TestStorePolicyString(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "StoreAll", server.StoreAll.String())
	assert.Equal(t, "SkipServerErrors", server.SkipServerErrors.String())
	assert.Equal(t, "StorePolicy(9)", server.StorePolicy(9).String())
}

// TestLogsCarryNoKeysNorBodies makes the middleware log what it logs (a
// take-over, a store failure) and checks that no key, body or header value
// appears.
func TestLogsCarryNoKeysNorBodies(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	store := openSQLite(t)
	g := newGate()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			g.wait()
		}
		created(w, r)
	}, withStore(store), func(c *server.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.LockTimeout = time.Hour
	})
	const key, secret = "key-4f1d9a", "card-4242424242424242"
	go e.send(t.Context(), http.MethodPost, "/orders", `{"s":"`+secret+`"}`, "Idempotency-Key", key, "X-Hold", secret) //nolint:errcheck
	g.waitEntered(t)
	e.clock.Advance(2 * time.Hour)
	e.post("/orders", key, `{"s":"`+secret+`"}`, "X-Hold", "")
	g.release()
	require.Eventually(t, func() bool { return strings.Contains(buf.String(), "lock lost") }, timeout, tick)
	require.NoError(t, store.Close())
	e.post("/orders", "other-"+key, `{"s":"`+secret+`"}`)

	logs := buf.String()
	assert.Contains(t, logs, "stale", "the take-over is logged")
	assert.Contains(t, logs, "claim failed", "the store failure is logged")
	assert.Contains(t, logs, "key_hash")
	assert.NotContains(t, logs, key)
	assert.NotContains(t, logs, secret)
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestNewRequiresAScope: without a Scope every caller would share one key
// space, and anyone who can name a key would get its stored response. The
// application must decide, and an API with one tenant says so.
func TestNewRequiresAScope(t *testing.T) {
	t.Parallel()
	mw, err := server.New(server.Config{Store: server.NewMemoryStore()})
	var ce *server.ConfigError
	require.ErrorAs(t, err, &ce)
	assert.Nil(t, mw)
	assert.Equal(t, "Scope", ce.Field)
	assert.Contains(t, ce.Problem, "tenant", "the error says what a scope is")
	assert.Contains(t, ce.Problem, "server.SingleTenant", "and what an API with one tenant sets")

	mw, err = server.New(server.Config{Store: server.NewMemoryStore(), Scope: server.SingleTenant})
	require.NoError(t, err, "SingleTenant is an explicit decision")
	require.NoError(t, mw.Close())
	assert.Equal(t, "", server.SingleTenant(httptest.NewRequest(http.MethodPost, "/orders", nil)), "SingleTenant puts every request in one scope")
}
