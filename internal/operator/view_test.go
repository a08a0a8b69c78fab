package operator

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFormatting(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "abc", Cut("abc", 3))
	assert.Equal(t, "ab…", Cut("abcd", 3))
	assert.Equal(t, "héllo wo…", Cut("héllo world", 9))
	assert.Equal(t, "abcdef", CutMiddle("abcdef", 6))
	assert.Equal(t, "ab…fg", CutMiddle("abcdefg", 5))

	for d, want := range map[time.Duration]string{
		-time.Second:                      "0s",
		42 * time.Second:                  "42s",
		5*time.Minute + 3*time.Second:     "5m03s",
		3*time.Hour + 7*time.Minute:       "3h07m",
		47*time.Hour + 59*time.Minute:     "47h59m",
		12*24*time.Hour + 4*time.Hour + 1: "12d04h",
	} {
		assert.Equal(t, want, FormatAge(d), d.String())
	}
	assert.Equal(t, "512 B", FormatBytes(512))
	assert.Equal(t, "1.5 KiB", FormatBytes(1536))
	assert.Equal(t, "3.0 MiB", FormatBytes(3<<20))

	assert.True(t, IsText([]byte("line\n\ttab\r\n")))
	assert.False(t, IsText([]byte{0xff}))
	assert.False(t, IsText([]byte("bell\x07")))

	now := time.Date(2025, 11, 29, 12, 0, 0, 0, time.UTC)
	assert.Equal(t, "-", FormatTime(time.Time{}, now))
	assert.Equal(t, "2025-11-29 11:59:18.000Z (42s ago)", FormatTime(now.Add(-42*time.Second), now))
	assert.Equal(t, "2025-11-29 12:05:03.000Z (in 5m03s)", FormatTime(now.Add(5*time.Minute+3*time.Second), now))
}

func TestIsCredentialHeader(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie", "X-Api-Key",
		"X-Auth-Token", "X-Client-Secret", "X-Session-Id", "X-Signature", "Apikey"} {
		assert.True(t, IsCredentialHeader(http.CanonicalHeaderKey(name)), name)
	}
	for _, name := range []string{"Content-Type", "X-Request-Id", "Idempotency-Key", "Accept", "X-Tenant"} {
		assert.False(t, IsCredentialHeader(name), name)
	}
}

func TestParseAge(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		"0s":     0,
		"0":      0,
		"90m":    90 * time.Minute,
		"36h":    36 * time.Hour,
		"7d":     7 * 24 * time.Hour,
		"0d":     0,
		"1.5d":   36 * time.Hour,
		"1d12h":  36 * time.Hour,
		" 2d ":   48 * time.Hour,
		"1h30m":  90 * time.Minute,
		"250ms":  250 * time.Millisecond,
		"365d":   365 * 24 * time.Hour,
		"1d1ms":  24*time.Hour + time.Millisecond,
		"10d10h": 250 * time.Hour,
	} {
		got, err := ParseAge(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "7x", "d", "xd", "-1h", "-7d", "7dd", "1d-1h", "NaNd", "Infd", "1e300d", "7 d", "h"} {
		_, err := ParseAge(in)
		assert.Error(t, err, in)
	}
}
