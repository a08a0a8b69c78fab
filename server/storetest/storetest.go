// Package storetest is the conformance suite every server.Store must pass.
// Run it from a test of the implementation:
//
//	func TestMyStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) server.Store {
//			s := mystore.Open(…)
//			t.Cleanup(func() { s.Close() })
//			return s
//		})
//	}
//
// The suite passes every time explicitly (Now, ExpiresAt, StaleBefore), so
// a store needs no clock of its own, and its tests need no sleeps.
package storetest

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

// Factory returns a new, empty store for one test, and registers its
// cleanup with t.
type Factory func(t *testing.T) server.Store

// Run runs the whole suite against the stores newStore makes. Each test
// gets a store of its own and runs in parallel with the others.
func Run(t *testing.T, newStore Factory) {
	t.Helper()
	groups := []struct {
		name  string
		tests []test
	}{
		{"Claim", claimTests},
		{"Lifecycle", lifecycleTests},
		{"Fencing", fencingTests},
		{"Expiry", expiryTests},
		{"Scope", scopeTests},
		{"Inputs", inputTests},
		{"Concurrency", concurrencyTests},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range g.tests {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					tc.fn(t, newStore(t))
				})
			}
		})
	}
}

type test struct {
	name string
	fn   func(t *testing.T, s server.Store)
}

// t0 is the suite's epoch: far from the zero time and from now, so that a
// store that reads its own clock instead of the given times fails.
var t0 = time.Date(2031, 3, 14, 15, 9, 26, 535897000, time.UTC)

const (
	retention   = 24 * time.Hour
	lockTimeout = time.Minute
)

var ctx = context.Background()

// claimAt builds the claim the middleware would make at now.
func claimAt(scope, key, fp string, now time.Time) server.ClaimRequest {
	return server.ClaimRequest{
		Scope: scope, Key: key, Fingerprint: fp, Method: http.MethodPost, Path: "/orders",
		Now: now, ExpiresAt: now.Add(retention), StaleBefore: now.Add(-lockTimeout),
	}
}

func mustClaim(t *testing.T, s server.Store, req server.ClaimRequest) server.ClaimResult {
	t.Helper()
	res, err := s.Claim(ctx, req)
	require.NoError(t, err)
	require.True(t, res.Claimed, "the claim of %s/%s must succeed", req.Scope, req.Key)
	require.NotZero(t, res.Token, "a claim must hand out a non-zero token")
	return res
}

func response(body string) *server.StoredResponse {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Add("X-Multi", "a")
	h.Add("X-Multi", "b")
	// A trailer, as the middleware keeps one: under net/http's
	// TrailerPrefix, a name with a colon, kept as any other.
	h.Set("Trailer", "X-Sum")
	h[http.TrailerPrefix+"X-Sum"] = []string{"5d41402a"}
	return &server.StoredResponse{Status: http.StatusCreated, Header: h, Body: []byte(body)}
}

func complete(scope, key string, token int64, resp *server.StoredResponse, now time.Time) server.CompleteRequest {
	return server.CompleteRequest{Scope: scope, Key: key, Token: token, Response: resp, ExpiresAt: now.Add(retention)}
}

func mustGet(t *testing.T, s server.Store, scope, key string, now time.Time) server.Entry {
	t.Helper()
	e, err := s.Get(ctx, scope, key, now)
	require.NoError(t, err, "Get %s/%s", scope, key)
	return e
}

func requireAbsent(t *testing.T, s server.Store, scope, key string, now time.Time) {
	t.Helper()
	_, err := s.Get(ctx, scope, key, now)
	require.ErrorIs(t, err, server.ErrNotFound, "Get %s/%s must report ErrNotFound", scope, key)
}

func assertTime(t *testing.T, want, got time.Time, what string) {
	t.Helper()
	assert.True(t, want.Equal(got), "%s: want %s, got %s", what, want, got)
}

func assertResponse(t *testing.T, want, got *server.StoredResponse) {
	t.Helper()
	require.NotNil(t, got, "the entry must carry its response")
	assert.Equal(t, want.Status, got.Status)
	assert.Equal(t, want.Header, got.Header)
	assert.Equal(t, fmt.Sprintf("%q", want.Body), fmt.Sprintf("%q", got.Body), "the body must come back byte for byte")
}
