package main

// The Guard on PostgreSQL (issue 28, point 4): the server package's
// PostgreSQL store keeps the keys and results of a go-sdk server's tool
// calls. It lives in this module, which may require anything, so that
// neither the mcp module (pgx) nor the postgres module (go-sdk) makes its
// users download the other's dependencies.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemmcp "github.com/idemkit/idem/mcp"
	"github.com/idemkit/idem/postgres"
)

// postgresDSN is the database every machine of this project runs;
// IDEM_POSTGRES_DSN names another.
func postgresDSN() string {
	if dsn := os.Getenv("IDEM_POSTGRES_DSN"); dsn != "" {
		return dsn
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// postgresSchema is a schema of the test's own, dropped at its end.
func postgresSchema(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, postgresDSN())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("this test needs PostgreSQL at %s (set IDEM_POSTGRES_DSN to use another): %v", postgresDSN(), err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "idem_mcp_example_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	return pool, schema
}

// guardedOnPostgres is an MCP server on streamable HTTP whose send_email
// runs behind a Guard on a postgres.Store in schema, counting its runs by
// key; it returns a session to it and stops with the test.
func guardedOnPostgres(t *testing.T, pool *pgxpool.Pool, schema string, runs map[string]int, mu *sync.Mutex) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	store, err := postgres.OpenStore(ctx, pool, postgres.Schema(schema))
	require.NoError(t, err)
	guard, err := idemmcp.NewGuard(idemmcp.GuardConfig{Store: store, Tools: []string{"send_email"},
		Scope: func(context.Context, *mcp.CallToolRequest) string { return "agent-7" }})
	require.NoError(t, err)
	srv := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "send_email"}, func(_ context.Context, req *mcp.CallToolRequest, in emailArgs) (*mcp.CallToolResult, emailResult, error) {
		key, _ := req.Params.Meta[idemmcp.MetaKey].(string)
		mu.Lock()
		runs[key]++
		n := runs[key]
		mu.Unlock()
		return nil, emailResult{MessageID: in.To + "/" + key, Status: "sent #" + string(rune('0'+n))}, nil
	})
	srv.AddReceivingMiddleware(guard.Middleware)
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: -1}, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cs.Close()
		hs.Close()
		_ = guard.Close()
		_ = store.Close()
	})
	return cs
}

// Concurrent calls with one key, on two servers sharing one PostgreSQL
// store (two replicas), then the same keys again on a third server opened
// afterwards (a restart): each key's tool ran once, and every call got that
// run's result.
func TestGuardOnPostgresRunsAToolOncePerKey(t *testing.T) {
	pool, schema := postgresSchema(t)
	var mu sync.Mutex
	runs := map[string]int{}
	replicas := []*mcp.ClientSession{guardedOnPostgres(t, pool, schema, runs, &mu), guardedOnPostgres(t, pool, schema, runs, &mu)}
	keys := []string{"call_a", "call_b", "call_c"}
	const callers = 8
	results := make([][]string, len(keys))
	for i := range results {
		results[i] = make([]string, callers)
	}
	var wg sync.WaitGroup
	for i, key := range keys {
		for c := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := replicas[c%2].CallTool(context.Background(), &mcp.CallToolParams{Name: "send_email",
					Arguments: emailArgs{To: "ann", Template: "t"}, Meta: mcp.Meta{idemmcp.MetaKey: key}})
				if assert.NoError(t, err, "%s caller %d", key, c) {
					if !assert.False(t, res.IsError, "%s caller %d: %v", key, c, res.Content) {
						return
					}
					out := res.StructuredContent.(map[string]any)
					results[i][c] = out["message_id"].(string) + " " + out["status"].(string)
				}
			}()
		}
	}
	wg.Wait()

	restarted := guardedOnPostgres(t, pool, schema, runs, &mu)
	for i, key := range keys {
		res, err := restarted.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_email",
			Arguments: map[string]any{"template": "t", "to": "ann"}, Meta: mcp.Meta{idemmcp.MetaKey: key}})
		require.NoError(t, err)
		assert.Equal(t, true, res.Meta[idemmcp.MetaReplayed], "%s after the restart: replayed", key)
		out := res.StructuredContent.(map[string]any)
		for c := range callers {
			assert.Equal(t, "ann/"+key+" sent #1", results[i][c], "%s caller %d got the first run's result", key, c)
		}
		assert.Equal(t, "ann/"+key+" sent #1", out["message_id"].(string)+" "+out["status"].(string))
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]int{"call_a": 1, "call_b": 1, "call_c": 1}, runs, "each key's tool ran once")
}
