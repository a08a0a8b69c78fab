package idem_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// The counts, sizes and rates of Config and RetryPolicy follow the
// durations' rule: zero is the default, and a value that has no meaning
// (negative, or for a rate NaN or infinite) is refused with an error that
// names the field, instead of silently becoming the default: a
// MaxAttempts of -1 meant as "no retries" would otherwise retry five
// times.
func TestNewRefusesACountOrRateWithoutMeaning(t *testing.T) {
	t.Parallel()
	j := idem.NewMemoryJournal()
	t.Cleanup(func() { j.Close() })
	for _, tc := range []struct {
		field string
		set   func(*idem.Config)
		says  string
	}{
		{"Config.MaxResponseBytes", func(c *idem.Config) { c.MaxResponseBytes = -1 }, "is negative (-1)"},
		{"Config.ResumeConcurrency", func(c *idem.Config) { c.ResumeConcurrency = -8 }, "is negative (-8)"},
		{"Config.Retry.MaxAttempts", func(c *idem.Config) { c.Retry.MaxAttempts = -1 }, "is negative (-1)"},
		{"Config.Retry.MaxStatusChecks", func(c *idem.Config) { c.Retry.MaxStatusChecks = -2 }, "is negative (-2)"},
		{"Config.Retry.RetryRatio", func(c *idem.Config) { c.Retry.RetryRatio = -0.5 }, "is negative (-0.5)"},
		{"Config.Retry.RetryRatio", func(c *idem.Config) { c.Retry.RetryRatio = math.NaN() }, "is NaN"},
		{"Config.Retry.MinRetriesPerSecond", func(c *idem.Config) { c.Retry.MinRetriesPerSecond = math.Inf(1) }, "is +Inf"},
		{"Config.Retry.MinRetriesPerSecond", func(c *idem.Config) { c.Retry.MinRetriesPerSecond = -1 }, "is negative (-1)"},
	} {
		cfg := idem.Config{Journal: j}
		tc.set(&cfg)
		c, err := idem.New(cfg)
		require.ErrorIs(t, err, idem.ErrInvalidConfig, tc.field)
		require.Nil(t, c)
		assert.Contains(t, err.Error(), tc.field+" "+tc.says, tc.field)
		assert.Contains(t, err.Error(), "leave it zero for its default", tc.field)
	}

	// One at a time is not the only way: every mistake is named at once.
	_, err := idem.New(idem.Config{Journal: j, MaxResponseBytes: -1, Retry: idem.RetryPolicy{MaxAttempts: -1}})
	require.ErrorIs(t, err, idem.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "Config.MaxResponseBytes")
	assert.Contains(t, err.Error(), "Config.Retry.MaxAttempts")

	// 1 is a legal MaxAttempts (no retry), kept as given.
	c, err := idem.New(idem.Config{Journal: j, Retry: idem.RetryPolicy{MaxAttempts: 1, RetryRatio: 2.5}})
	require.NoError(t, err)
	require.NoError(t, c.Close())
}
