package webui

import (
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
)

// A value with a format character (a bidirectional override or isolate,
// a zero-width character) is shown quoted, the character as an escape:
// shown as itself, "refund/\u202Edecnalab-ton" would read in the browser
// as "refund/not-balanced", another operation's ID.
func TestVisibleEscapesFormatCharacters(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"refund/\u202Edecnalab-ton", "https://api.example/\u2066pay\u2069", "a\u200Fb", "pay\u200B"} {
		v := visible(s, maxValue)
		assert.False(t, strings.ContainsFunc(v, func(r rune) bool { return unicode.Is(unicode.Cf, r) }), "%q shown as %q", s, v)
		assert.Contains(t, v, `\u`, "%q shown as %q", s, v)
	}
	assert.Equal(t, "refund/nächste", visible("refund/nächste", maxValue), "printable text is shown as it is")
}
