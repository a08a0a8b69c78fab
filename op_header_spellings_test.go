package idem_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// An Op.Header may hold one header under two spellings of its name (a map
// filled by two libraries, one canonical and one not); net/http sends both
// lines, and the server reads one header with both values. Do keeps one of
// them, chosen by the map's iteration order: what is journaled and sent
// drops a value at random, and when the header is one of the Op's
// SignificantHeaders, calling Do again with the very same Op (after a
// restart, say) computes another fingerprint half of the time and fails
// with ErrFingerprintMismatch. The same Op must always be the same operation,
// with every value sent.
func TestOpHeaderWithTwoSpellingsIsOneOperation(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got [][]string
	srv := newScripted(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Values("X-Trace"))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
	ctx := context.Background()
	op := func() idem.Op {
		o := orderOp("op-1", 1)
		o.Header = http.Header{"X-Trace": {"canonical"}}
		o.Header["x-trace"] = []string{"lower"}
		o.SignificantHeaders = []string{"X-Trace"} // the header is part of what the operation is
		return o
	}
	_, err := c.Do(ctx, op())
	require.NoError(t, err)
	mismatches := 0
	for range 20 {
		if _, err := c.Do(ctx, op()); err != nil {
			require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
			mismatches++
		}
	}
	assert.Zero(t, mismatches, "of 20 calls of Do with the same Op, %d failed with ErrFingerprintMismatch", mismatches)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 1)
	assert.ElementsMatch(t, []string{"canonical", "lower"}, got[0], "the values the server received")
}
