package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

var expiryTests = []test{
	{"ExpiredEntryReadsAsAbsent", func(t *testing.T, s server.Store) {
		c := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		require.NoError(t, s.Complete(ctx, complete("", "k1", c.Token, response("x"), t0)))
		expiry := t0.Add(retention)
		mustGet(t, s, "", "k1", expiry.Add(-1))
		requireAbsent(t, s, "", "k1", expiry)
	}},
	{"ExpiredEntryIsReplacedByAClaim", func(t *testing.T, s server.Store) {
		c := mustClaim(t, s, claimAt("", "k1", "fp1", t0))
		require.NoError(t, s.Complete(ctx, complete("", "k1", c.Token, response("x"), t0)))
		later := t0.Add(retention)
		// After the retention a reuse of the key is a new request, whatever
		// its payload.
		res := mustClaim(t, s, claimAt("", "k1", "fp2", later))
		assert.False(t, res.TookOver)
		e := mustGet(t, s, "", "k1", later)
		assert.Equal(t, server.InProgress, e.State)
		assert.Equal(t, "fp2", e.Fingerprint)
		assertTime(t, later, e.CreatedAt, "a replaced entry starts anew")
		assert.Nil(t, e.Response)
	}},
	{"SweepDeletesOnlyExpiredEntries", func(t *testing.T, s server.Store) {
		for i, age := range []time.Duration{0, time.Hour, 2 * time.Hour, 3 * time.Hour} {
			req := claimAt("", fmt.Sprint("k", i), "fp", t0.Add(age))
			c := mustClaim(t, s, req)
			if i%2 == 0 {
				require.NoError(t, s.Complete(ctx, complete("", req.Key, c.Token, response("x"), t0.Add(age))))
			}
		}
		now := t0.Add(retention + time.Hour)
		n, err := s.Sweep(ctx, now)
		require.NoError(t, err)
		assert.Equal(t, 2, n, "k0 and k1 expired by now")
		for _, k := range []string{"k0", "k1"} {
			requireAbsent(t, s, "", k, t0)
		}
		for _, k := range []string{"k2", "k3"} {
			mustGet(t, s, "", k, now)
		}
		n, err = s.Sweep(ctx, now)
		require.NoError(t, err)
		assert.Zero(t, n, "a second sweep finds nothing")
	}},
	{"SweepOfALargeBacklog", func(t *testing.T, s server.Store) {
		const total = 1234
		for i := range total {
			mustClaim(t, s, claimAt("", fmt.Sprint("k", i), "fp", t0))
		}
		n, err := s.Sweep(ctx, t0.Add(retention))
		require.NoError(t, err)
		assert.Equal(t, total, n)
		requireAbsent(t, s, "", "k0", t0)
		requireAbsent(t, s, "", fmt.Sprint("k", total-1), t0)
	}},
}
