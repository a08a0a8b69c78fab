package main

import (
	"context"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// "idem resume" on a PostgreSQL journal works as one more worker of the
// fleet: it registers, takes over at once the lease of a worker that is
// gone, leaves alone the one a live worker holds, settles what it takes
// up, and leaves the fleet when done; "idem show" then tells who took the
// operation over from whom and why, and "idem stats" and "ls --owner"
// list the workers.
func TestPostgresResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	secret := "sk_test_" + newKey()
	api := newAPIServer(t, "X-Api-Token", secret)
	schema, j := pgJournal(t)
	pending := put(t, j, op{id: "checkout/cart-1", url: api.URL + "/orders", body: []byte(`{"cart":1}`)})
	orphan := put(t, j, op{id: "checkout/cart-2", url: api.URL + "/orders", body: []byte(`{"cart":2}`)})
	held := put(t, j, op{id: "checkout/cart-3", url: api.URL + "/orders", body: []byte(`{"cart":3}`)})
	other := put(t, j, op{scope: "tenant-b", id: "checkout/cart-4", url: api.URL + "/orders", body: []byte(`{"cart":4}`)})

	// worker-dead took cart-2 and died (its session's lock is gone);
	// worker-live holds cart-3 and is alive.
	leave, err := j.Register(ctx, "worker-dead")
	require.NoError(t, err)
	_, err = j.Acquire(ctx, orphan.Key, "worker-dead", time.Hour)
	require.NoError(t, err)
	require.NoError(t, leave())
	stay, err := j.Register(ctx, "worker-live")
	require.NoError(t, err)
	defer stay()
	_, err = j.Acquire(ctx, held.Key, "worker-live", time.Hour)
	require.NoError(t, err)

	// The fleet as stats sees it, before the run.
	r := idemOnPG(t, schema, "stats")
	requireOK(t, r)
	assert.Regexp(t, `(?m)^  worker-live +alive +1 +`, r.stdout)
	assert.Regexp(t, `(?m)^  worker-dead +gone +1 +`, r.stdout)
	r = idemOnPG(t, schema, "ls", "--owner", "worker-live", "--json")
	requireOK(t, r)
	assert.Equal(t, []string{held.Key}, keysOf(jsonLines(t, r.stdout)))

	env := []string{"IDEM_TEST_API_TOKEN=" + secret}
	args := []string{"--journal", dsnWithPassword(t), "--schema", schema, "resume", "--base-url", api.URL,
		"--status-url", api.URL + "/idempotency", "--header-env", "X-Api-Token=IDEM_TEST_API_TOKEN"}
	r = cli(t, "", env, args...)
	requireNoPassword(t, r, args)
	require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	assert.Equal(t, map[string]int{"claimed": 2, "succeeded": 2, "skipped": 1, "leased": 1}, nonZero(summary(t, r.stdout)))
	assert.Contains(t, r.stdout, "left alone 1 unsettled operation(s) of other scopes (tenant-b)")

	for _, rec := range []idem.Record{pending, orphan} {
		got, err := j.Get(ctx, rec.Key)
		require.NoError(t, err)
		assert.Equal(t, idem.StateSucceeded, got.State, rec.ID)
	}
	for _, rec := range []idem.Record{held, other} {
		got, err := j.Get(ctx, rec.Key)
		require.NoError(t, err)
		assert.Equal(t, idem.StatePending, got.State, rec.ID)
	}

	// Who took cart-2 over, from whom, and why.
	r = idemOnPG(t, schema, "show", orphan.Key)
	requireOK(t, r)
	claim := regexp.MustCompile(`(?m)^  \d+ +\S+ \S+ +claim +.* (idem-resume/\S+) +(.*)$`).FindStringSubmatch(r.stdout)
	require.NotNil(t, claim, "a claim by idem resume in:\n%s", r.stdout)
	assert.Contains(t, claim[2], "worker-dead", "the claim names the worker it took over from")

	// It left the fleet: its owner is gone, and holds nothing.
	r = idemOnPG(t, schema, "stats")
	requireOK(t, r)
	assert.Regexp(t, `(?m)^  worker-live +alive +1 +`, r.stdout)
	assert.NotRegexp(t, `(?m)^  idem-resume/\S+ +alive`, r.stdout)
	api.mu.Lock()
	assert.Zero(t, api.unauthorized)
	api.mu.Unlock()
	_ = http.StatusOK
}
