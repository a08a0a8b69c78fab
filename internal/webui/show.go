package webui

import (
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem/internal/operator"
)

// Caps on what a page shows of one value. The journal holds whatever the
// application sent; a page stays readable and small whatever that was.
const (
	// maxTextBody is the most of a text body a page shows, in bytes.
	maxTextBody = 64 << 10
	// maxBinaryBody is the most of a binary body shown as a hex dump.
	maxBinaryBody = 4 << 10
	// maxValue is the most of a name, an ID or a header value shown, in
	// runes.
	maxValue = 2000
)

// visible is s as a page shows it: s itself when it is printable text,
// else Go-quoted so that a NUL, a control character, a format character
// (a bidirectional override such as U+202E, which would make the browser
// show the ID reordered, or a zero-width one) or a byte that is not UTF-8
// shows as an escape (\x00, \u202e, \xff) rather than vanishing or
// reordering the text; cut to n runes with what was left out said.
// html/template escapes the result.
func visible(s string, n int) string {
	if !utf8.ValidString(s) || strings.ContainsFunc(s, unicode.IsControl) || strings.ContainsFunc(s, isFormat) {
		s = strconv.Quote(s)
	}
	if c := utf8.RuneCountInString(s); c > n {
		return operator.Cut(s, n) + " (" + strconv.Itoa(c-n+1) + " more characters not shown)"
	}
	return s
}

// body is a request or response body as a page shows it.
type body struct {
	Len int
	// Text is the body when it is text (UTF-8 without control characters
	// other than tabs and line breaks), cut to maxTextBody.
	Text string
	// Hex is a hex dump of the body's first maxBinaryBody bytes when it
	// is not text.
	Hex string
	// Shown is how many of its bytes are shown, less than Len when cut.
	Shown int
}

// IsText says which of Text and Hex holds the body.
func (b body) IsText() bool { return b.Hex == "" }

// Cut says the body is longer than what is shown.
func (b body) Cut() bool { return b.Shown < b.Len }

func newBody(b []byte) body {
	out := body{Len: len(b)}
	if len(b) == 0 {
		return out
	}
	if operator.IsText(b) {
		n := min(len(b), maxTextBody)
		for n < len(b) && n > 0 && !utf8.RuneStart(b[n]) {
			n-- // cut on a character boundary
		}
		out.Text, out.Shown = string(b[:n]), n
		return out
	}
	n := min(len(b), maxBinaryBody)
	out.Hex, out.Shown = hex.Dump(b[:n]), n
	return out
}

// headerLine is one header value as a page shows it.
type headerLine struct {
	Name, Value string
	// Hidden: the value is a credential's, and is not shown.
	Hidden bool
}

// headerLines are h's values in name order, credentials hidden.
func headerLines(h http.Header) []headerLine {
	var lines []headerLine
	for _, name := range operator.SortedHeader(h) {
		for _, v := range h[name] {
			l := headerLine{Name: visible(name, 200)}
			if operator.IsCredentialHeader(name) {
				l.Hidden = true
			} else {
				l.Value = visible(v, maxValue)
			}
			lines = append(lines, l)
		}
	}
	return lines
}

// isFormat reports a format character (unicode.Cf), which a browser or a
// terminal does not show as itself but obeys (bidi overrides) or hides.
func isFormat(r rune) bool { return unicode.Is(unicode.Cf, r) }
