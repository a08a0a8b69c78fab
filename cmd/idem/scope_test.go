package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// tenantServer is one API for two tenants, a and b: POST /{tenant}/orders
// needs the tenant's bearer token, or the operator's, and runs each key
// once.
type tenantServer struct {
	*httptest.Server
	mu       sync.Mutex
	requests []tenantRequest
	executed map[string]int // by key
}

type tenantRequest struct{ tenant, auth, key string }

var tenantTokens = map[string]string{"a": "Bearer token-a", "b": "Bearer token-b"}

const operatorToken = "Bearer operator"

func (s *tenantServer) serve(w http.ResponseWriter, r *http.Request) {
	tenant, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	auth, key := r.Header.Get("Authorization"), r.Header.Get("Idempotency-Key")
	_, _ = io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, tenantRequest{tenant, auth, key})
	if auth != tenantTokens[tenant] && auth != operatorToken {
		http.Error(w, "not this tenant's token", http.StatusUnauthorized)
		return
	}
	if s.executed[key] > 0 {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	s.executed[key]++
	w.WriteHeader(http.StatusCreated)
}

func (s *tenantServer) seen() []tenantRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]tenantRequest(nil), s.requests...)
}

// twoTenants is one journal in which the client of each tenant, with its
// own scope and token, left an order pending: the server was down. The
// server then comes up where it was.
func twoTenants(t *testing.T) (path string, srv *tenantServer, recs map[string]idem.Record) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // down
	base := "http://" + addr

	path, j := openTestJournal(t)
	recs = map[string]idem.Record{}
	for tenant, token := range tenantTokens {
		c, err := idem.New(idem.Config{Journal: j, Scope: "tenant-" + tenant, BaseURL: base,
			Authorize: func(r *http.Request) error { r.Header.Set("Authorization", token); return nil },
			Retry:     idem.RetryPolicy{MaxAttempts: 1, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond}})
		require.NoError(t, err)
		_, err = c.Do(context.Background(), idem.Op{ID: "order-1", Method: "POST", URL: "/" + tenant + "/orders", Body: []byte(`{}`)})
		require.ErrorIs(t, err, idem.ErrNotSent)
		require.NoError(t, c.Close())
		recs[tenant], err = j.Lookup(context.Background(), "tenant-"+tenant, "order-1")
		require.NoError(t, err)
		require.Equal(t, idem.StatePending, recs[tenant].State)
	}
	require.NoError(t, j.Close())

	srv = &tenantServer{executed: map[string]int{}}
	srv.Server = httptest.NewUnstartedServer(http.HandlerFunc(srv.serve))
	srv.Listener.Close()
	srv.Listener, err = net.Listen("tcp", addr) // up again, where it was
	require.NoError(t, err)
	srv.Start()
	t.Cleanup(srv.Close)
	return path, srv, recs
}

// idem resume stays in the scope it is given, whose credentials it has:
// tenant A's token never goes with tenant B's operation, which stays
// pending until a run for tenant B, or an operator's run over every scope,
// takes it up.
func TestResumeStaysInItsScope(t *testing.T) {
	t.Parallel()
	env := []string{"TOKEN_A=" + tenantTokens["a"], "TOKEN_B=" + tenantTokens["b"], "OPERATOR_TOKEN=" + operatorToken}

	t.Run("one tenant", func(t *testing.T) {
		t.Parallel()
		path, srv, recs := twoTenants(t)
		r := cli(t, "", env, "--journal", path, "resume", "--scope", "tenant-a", "--base-url", srv.URL, "--replay",
			"--header-env", "Authorization=TOKEN_A")
		require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
		assert.Empty(t, r.stderr)
		assert.Equal(t, map[string]int{"claimed": 1, "succeeded": 1}, nonZero(summary(t, r.stdout)))
		assert.Contains(t, r.stdout, "\nresume: left alone 1 unsettled operation(s) of other scopes (tenant-b); --scope or --all-scopes takes them up\n")

		assert.Equal(t, []tenantRequest{{"a", tenantTokens["a"], recs["a"].Key}}, srv.seen(), "only tenant A's operation, with A's token")
		assert.Equal(t, idem.StateSucceeded, getRecord(t, path, recs["a"].Key).State)
		b := getRecord(t, path, recs["b"].Key)
		assert.Equal(t, recs["b"], b, "tenant B's operation is untouched")

		// Tenant B's run, with B's token, takes B's.
		r = cli(t, "", env, "--journal", path, "resume", "--scope", "tenant-b", "--base-url", srv.URL, "--replay",
			"--header-env", "Authorization=TOKEN_B")
		require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
		assert.Equal(t, map[string]int{"claimed": 1, "succeeded": 1}, nonZero(summary(t, r.stdout)))
		assert.NotContains(t, r.stdout, "other scopes")
		assert.Equal(t, idem.StateSucceeded, getRecord(t, path, recs["b"].Key).State)
		assert.Equal(t, tenantRequest{"b", tenantTokens["b"], recs["b"].Key}, srv.seen()[1])
	})

	t.Run("the default scope is default", func(t *testing.T) {
		t.Parallel()
		path, srv, recs := twoTenants(t)
		r := cli(t, "", env, "--journal", path, "resume", "--base-url", srv.URL, "--replay", "--header-env", "Authorization=OPERATOR_TOKEN")
		require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
		assert.Empty(t, nonZero(summary(t, r.stdout)))
		assert.Contains(t, r.stdout, "\nresume: left alone 2 unsettled operation(s) of other scopes (tenant-")
		assert.Empty(t, srv.seen())
		for _, rec := range recs {
			assert.Equal(t, rec, getRecord(t, path, rec.Key))
		}
	})

	for name, flags := range map[string][]string{
		"every scope":         {"--all-scopes"},
		"both scopes":         {"--scope", "tenant-a", "--scope", "tenant-b"},
		"both, the other way": {"--scope=tenant-b", "--scope=tenant-a"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path, srv, recs := twoTenants(t)
			args := append([]string{"--journal", path, "resume", "--base-url", srv.URL, "--replay",
				"--header-env", "Authorization=OPERATOR_TOKEN"}, flags...)
			r := cli(t, "", env, args...)
			require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			assert.Equal(t, map[string]int{"claimed": 2, "succeeded": 2}, nonZero(summary(t, r.stdout)))
			assert.NotContains(t, r.stdout, "other scopes")
			assert.ElementsMatch(t, []tenantRequest{{"a", operatorToken, recs["a"].Key}, {"b", operatorToken, recs["b"].Key}}, srv.seen())
			for _, rec := range recs {
				assert.Equal(t, idem.StateSucceeded, getRecord(t, path, rec.Key).State)
			}
		})
	}
}
