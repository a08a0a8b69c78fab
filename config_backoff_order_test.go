package idem_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// MinBackoff above MaxBackoff (here MinBackoff 20 s against MaxBackoff's
// default of 5 s) is refused by New, naming both: before, New accepted it
// and the first retry panicked in RetryPolicy.backoff.
func TestNewRefusesMinBackoffAboveMaxBackoff(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	j := idem.NewMemoryJournal()
	t.Cleanup(func() { j.Close() })
	for _, p := range []idem.RetryPolicy{
		{MinBackoff: 20 * time.Second},
		{MaxBackoff: 50 * time.Millisecond},
		{MinBackoff: 2 * time.Second, MaxBackoff: time.Second},
	} {
		c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Retry: p})
		if err == nil {
			var panicked any
			func() {
				defer func() { panicked = recover() }()
				_, _ = c.Do(t.Context(), idem.Op{ID: "pay", URL: "/p"})
			}()
			c.Close()
			t.Fatalf("New accepted %+v; Do panicked: %v", p, panicked)
		}
		require.ErrorIs(t, err, idem.ErrInvalidConfig)
		assert.Contains(t, err.Error(), "Config.Retry.MaxBackoff")
		assert.Contains(t, err.Error(), "is below Config.Retry.MinBackoff")
	}
}
