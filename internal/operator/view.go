package operator

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
)

// FormatAge prints a duration with its two largest units: 42s, 5m03s,
// 3h07m, 12d04h.
func FormatAge(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	default:
		return fmt.Sprintf("%dd%02dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
	}
}

// TimeLayout is how a journal time is printed: UTC, milliseconds.
const TimeLayout = "2006-01-02 15:04:05.000Z07:00"

// FormatTime prints a journal time in UTC with milliseconds, and how long
// ago it was (or is to come); "-" for the zero time.
func FormatTime(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	s := t.UTC().Format(TimeLayout)
	if d := now.Sub(t); d >= 0 {
		return s + " (" + FormatAge(d) + " ago)"
	}
	return s + " (in " + FormatAge(t.Sub(now)) + ")"
}

// IsText reports whether b shows safely as text: UTF-8 without control
// characters other than tab and line breaks.
func IsText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) && r != '\n' && r != '\r' && r != '\t' {
			return false
		}
	}
	return true
}

// Cut shortens s to n runes, replacing its end with an ellipsis.
func Cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// CutMiddle shortens s to n runes, replacing its middle with an ellipsis:
// for names whose end tells them apart, such as "checkout/cart-42".
func CutMiddle(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	head := (n - 1) / 2
	tail := n - 1 - head
	return string(r[:head]) + "…" + string(r[len(r)-tail:])
}

// SortedHeader returns h's names in order.
func SortedHeader(h http.Header) []string {
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// PastRetention reports whether rec may have reached the server, is not
// settled, and the server's key retention (ExpiresAt) has passed at now:
// the next Resume marks it expired without sending anything, as no status
// check can settle it any more. This is the test Resume applies.
func PastRetention(rec idem.Record, now time.Time) bool {
	return (rec.State == idem.StateInFlight || rec.State == idem.StateUnknown) &&
		!rec.ExpiresAt.IsZero() && now.After(rec.ExpiresAt)
}

// PastRetentionNote says what PastRetention means.
const PastRetentionNote = "past the server's retention: Resume marks it expired without sending"

// LastError is the record's last error, or its note when an operator
// settled it.
func LastError(rec idem.Record) string {
	switch {
	case rec.Note == "":
		return rec.LastError
	case rec.LastError == "":
		return rec.Note
	}
	return rec.LastError + ": " + rec.Note
}

// KeyFormText says how the record's key goes on the wire.
func KeyFormText(rec idem.Record) string {
	if rec.KeyHeader == "" {
		return "not journaled (sent in the resuming client's form)"
	}
	form := "bare token"
	if rec.KeyQuoted {
		form = "quoted: an RFC 8941 sf-string"
	}
	return fmt.Sprintf("%s: %s (%s)", rec.KeyHeader, wire.FormatKey(rec.Key, rec.KeyQuoted), form)
}

// StateChange is "from → to", "→ to" for the creation, or "=" when the
// state stayed.
func StateChange(ev idem.Event) string {
	switch {
	case ev.From == 0:
		return "→ " + ev.To.String()
	case ev.From == ev.To:
		return "="
	}
	return ev.From.String() + " → " + ev.To.String()
}

// EventWhy is the event's Detail, followed by the record's error (or the
// operator's note) when the event set it and the detail does not already
// say it: a status check's detail says what the check answered, or why it
// failed, which is what its error repeats. prevError is the Error of the
// event before.
func EventWhy(ev idem.Event, prevError string) string {
	why := ev.Detail
	if ev.Kind == idem.EventStatus && why != "" {
		return why
	}
	if e := ev.Error; e != "" && e != prevError && !strings.Contains(why, e) {
		if why != "" {
			why += "; "
		}
		why += e
	}
	return why
}

// credentialWords are the parts of header names that carry credentials.
var credentialWords = []string{"auth", "token", "secret", "password", "passwd", "cookie", "session",
	"api-key", "apikey", "access-key", "signature"}

// IsCredentialHeader reports whether a header's value must not be shown:
// Authorization, Cookie, Set-Cookie and anything named like a token, a
// secret or an API key. The client never journals the first three nor
// the application's Config.SecretHeaders, but a journal written by other
// code may hold them, and an application's own headers may be named
// after what they carry.
func IsCredentialHeader(name string) bool {
	n := strings.ToLower(name)
	for _, w := range credentialWords {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// ParseAge parses a non-negative age: a Go duration such as 90m or 36h, or
// days such as 7d or 1d12h.
func ParseAge(v string) (time.Duration, error) {
	s := strings.TrimSpace(v)
	bad := func(why string) error {
		return fmt.Errorf("bad duration %q: %s (want a Go duration such as 90m or 36h, or days such as 7d)", v, why)
	}
	if s == "" {
		return 0, bad("empty")
	}
	if strings.HasPrefix(s, "-") {
		return 0, bad("negative")
	}
	var total time.Duration
	if i := strings.IndexByte(s, 'd'); i >= 0 {
		days, err := strconv.ParseFloat(s[:i], 64)
		if err != nil || s[:i] == "" || math.IsNaN(days) || math.IsInf(days, 0) || days < 0 {
			return 0, bad("the number of days does not parse")
		}
		if days*24*float64(time.Hour) > math.MaxInt64/2 {
			return 0, bad("too long")
		}
		total = time.Duration(days * 24 * float64(time.Hour))
		s = s[i+1:]
		if s == "" {
			return total, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, bad(strings.TrimPrefix(err.Error(), "time: "))
	}
	if d < 0 || total > math.MaxInt64-d {
		return 0, bad("out of range")
	}
	return total + d, nil
}
