package idem_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// Every duration of Config and RetryPolicy is checked by one rule in New:
// zero is its default, a negative value is refused, and a positive value
// below a millisecond (a bare number meant as seconds, hours or
// milliseconds) is refused with an error that names the field, says the
// value was nanoseconds and suggests what was likely meant.
func TestNewRefusesEveryDurationGivenAsABareNumber(t *testing.T) {
	t.Parallel()
	j := idem.NewMemoryJournal()
	t.Cleanup(func() { j.Close() })
	for _, tc := range []struct {
		field string
		set   func(*idem.Config, time.Duration)
		meant string
	}{
		{"Config.Retention", func(c *idem.Config, d time.Duration) { c.Retention = d }, "24 * time.Hour"},
		{"Config.AttemptTimeout", func(c *idem.Config, d time.Duration) { c.AttemptTimeout = d }, "24 * time.Second"},
		{"Config.LeaseDuration", func(c *idem.Config, d time.Duration) { c.LeaseDuration = d }, "24 * time.Second"},
		{"Config.ResumeInterval", func(c *idem.Config, d time.Duration) { c.ResumeInterval = d }, "24 * time.Second"},
		{"Config.Retry.MinBackoff", func(c *idem.Config, d time.Duration) { c.Retry.MinBackoff = d }, "24 * time.Millisecond"},
		{"Config.Retry.MaxBackoff", func(c *idem.Config, d time.Duration) { c.Retry.MaxBackoff = d }, "24 * time.Second"},
		{"Config.Retry.MaxRetryAfter", func(c *idem.Config, d time.Duration) { c.Retry.MaxRetryAfter = d }, "24 * time.Second"},
		{"Config.Retry.Budget", func(c *idem.Config, d time.Duration) { c.Retry.Budget = d }, "24 * time.Second"},
	} {
		cfg := idem.Config{Journal: j}
		tc.set(&cfg, 24)
		_, err := idem.New(cfg)
		require.ErrorIs(t, err, idem.ErrInvalidConfig, tc.field)
		assert.Contains(t, err.Error(), tc.field+" is 24ns: a time.Duration counts nanoseconds; did you mean "+tc.meant+"?")

		cfg = idem.Config{Journal: j}
		tc.set(&cfg, -time.Second)
		_, err = idem.New(cfg)
		require.ErrorIs(t, err, idem.ErrInvalidConfig, tc.field)
		assert.Contains(t, err.Error(), tc.field+" is negative")

		// The floor is not a unit mistake's only symptom: a value at it
		// is accepted (but LeaseDuration's, see below).
		if tc.field != "Config.LeaseDuration" {
			// MinBackoff at the floor too, so MaxBackoff's is not below it.
			cfg = idem.Config{Journal: j, Retry: idem.RetryPolicy{MinBackoff: time.Millisecond}}
			tc.set(&cfg, time.Millisecond)
			c, err := idem.New(cfg)
			require.NoError(t, err, tc.field)
			require.NoError(t, c.Close())
		}
	}
}

// LeaseDuration has a higher floor than the other durations: the client
// renews its leases every third of it, each time with a journal write.
func TestNewRefusesALeaseShorterThanItsRenewal(t *testing.T) {
	t.Parallel()
	j := idem.NewMemoryJournal()
	t.Cleanup(func() { j.Close() })
	_, err := idem.New(idem.Config{Journal: j, LeaseDuration: 50 * time.Millisecond})
	require.ErrorIs(t, err, idem.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "LeaseDuration is 50ms, shorter than its minimum of 100ms")
	c, err := idem.New(idem.Config{Journal: j, LeaseDuration: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, c.Close())
}
