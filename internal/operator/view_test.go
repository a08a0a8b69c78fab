package operator

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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
