package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
)

// newTable returns a tabwriter for aligned columns; Flush it.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// row writes one table row of cells, each made safe to print.
func row(w io.Writer, cells ...string) {
	for i, c := range cells {
		cells[i] = clean(c)
	}
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// clean replaces control characters, which could break the table or
// drive the terminal, and empty cells, which would shift columns.
func clean(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return '?'
		}
		return r
	}, s)
	if s == "" {
		return "-"
	}
	return s
}

// cut shortens s to n runes, replacing its end with an ellipsis.
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// cutMiddle shortens s to n runes, replacing its middle with an ellipsis:
// for names whose end tells them apart, such as "checkout/cart-42".
func cutMiddle(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	head := (n - 1) / 2
	tail := n - 1 - head
	return string(r[:head]) + "…" + string(r[len(r)-tail:])
}

// formatAge prints a duration with its two largest units: 42s, 5m03s,
// 3h07m, 12d04h.
func formatAge(d time.Duration) string {
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

// formatTime prints a journal time in UTC with milliseconds, and how long
// ago it was (or is to come).
func formatTime(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	s := t.UTC().Format("2006-01-02 15:04:05.000Z07:00")
	if d := now.Sub(t); d >= 0 {
		return s + " (" + formatAge(d) + " ago)"
	} else {
		return s + " (in " + formatAge(-d) + ")"
	}
}

// isText reports whether b prints safely as text on a terminal: UTF-8
// without control characters other than tab and line breaks.
func isText(b []byte) bool {
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

// writeJSON writes v as one line of JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// jsonRecord is a record as ls --json and show --json print it. ls leaves
// the fields marked "show" empty.
type jsonRecord struct {
	Key      string `json:"key"`
	Scope    string `json:"scope"`
	ID       string `json:"id"`
	State    string `json:"state"`
	Method   string `json:"method"`
	URL      string `json:"url"`
	Attempts int    `json:"attempts"`
	// TransportResends are the times Go's HTTP transport sent an attempt
	// again by itself; none is in Attempts.
	TransportResends int    `json:"transport_resends,omitempty"`
	StatusCode       int    `json:"status_code,omitempty"`
	LastError        string `json:"last_error,omitempty"`
	Note             string `json:"note,omitempty"`
	// Link relates the operation to the trace that created it.
	Link          string     `json:"link,omitempty"`
	CreatedAt     time.Time  `json:"created_at"`
	UpdatedAt     time.Time  `json:"updated_at"`
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	ExpiresAt     *time.Time `json:"expires_at,omitempty"`
	Lease         *jsonLease `json:"lease,omitempty"`
	Version       int64      `json:"version"`
	// PastRetention: the operation may have reached the server, is not
	// settled, and the server's key retention has passed: Resume marks it
	// expired without sending anything.
	PastRetention bool `json:"past_retention,omitempty"`

	// show
	Fingerprint  string        `json:"fingerprint,omitempty"`
	KeyForm      *jsonKeyForm  `json:"key_form,omitempty"`
	Header       http.Header   `json:"header,omitempty"`
	BodyBytes    *int          `json:"body_bytes,omitempty"`
	Body         *string       `json:"body,omitempty"`
	BodyEncoding string        `json:"body_encoding,omitempty"`
	Response     *jsonResponse `json:"response,omitempty"`
	History      []jsonEvent   `json:"history,omitempty"`
}

// jsonKeyForm is how the key goes on the wire. Journaled is false for a
// record written before idem kept the form (schema 1): it is sent in the
// form of whichever client resumes it.
type jsonKeyForm struct {
	Journaled bool   `json:"journaled"`
	Header    string `json:"header,omitempty"`
	Quoted    bool   `json:"quoted"`
	// Value is the header's value as sent: the key, quoted or bare.
	Value string `json:"value,omitempty"`
}

func newJSONKeyForm(rec idem.Record) *jsonKeyForm {
	if rec.KeyHeader == "" {
		return &jsonKeyForm{}
	}
	return &jsonKeyForm{Journaled: true, Header: rec.KeyHeader, Quoted: rec.KeyQuoted, Value: wire.FormatKey(rec.Key, rec.KeyQuoted)}
}

type jsonLease struct {
	Owner     string    `json:"owner"`
	Epoch     int64     `json:"epoch"`
	ExpiresAt time.Time `json:"expires_at"`
}

type jsonResponse struct {
	Status       int         `json:"status"`
	Header       http.Header `json:"header,omitempty"`
	Replayed     bool        `json:"replayed"`
	BodyBytes    int         `json:"body_bytes"`
	Body         *string     `json:"body,omitempty"`
	BodyEncoding string      `json:"body_encoding,omitempty"`
}

type jsonEvent struct {
	Version    int64     `json:"version"`
	At         time.Time `json:"at"`
	Kind       string    `json:"kind"`
	Detail     string    `json:"detail,omitempty"`
	From       string    `json:"from,omitempty"`
	To         string    `json:"to"`
	Attempt    int       `json:"attempt"`
	StatusCode int       `json:"status_code,omitempty"`
	Error      string    `json:"error,omitempty"`
	Owner      string    `json:"owner,omitempty"`
}

func utc(t time.Time) time.Time { return t.UTC() }

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// newJSONRecord is the summary of rec at now, without its request or
// response.
func newJSONRecord(rec idem.Record, now time.Time) jsonRecord {
	j := jsonRecord{
		Key: rec.Key, Scope: rec.Scope, ID: rec.ID, State: rec.State.String(),
		Method: rec.Method, URL: rec.URL, Attempts: rec.Attempts, TransportResends: rec.TransportResends,
		LastError: rec.LastError, Note: rec.Note, Link: rec.Link,
		CreatedAt: utc(rec.CreatedAt), UpdatedAt: utc(rec.UpdatedAt),
		NextAttemptAt: optTime(rec.NextAttemptAt), ExpiresAt: optTime(rec.ExpiresAt),
		Version: rec.Version, PastRetention: pastRetention(rec, now),
	}
	if rec.Response != nil {
		j.StatusCode = rec.Response.StatusCode
	}
	if rec.Lease.Owner != "" {
		j.Lease = &jsonLease{Owner: rec.Lease.Owner, Epoch: rec.Lease.Epoch, ExpiresAt: utc(rec.Lease.ExpiresAt)}
	}
	return j
}

// jsonBody encodes a body for JSON: as a string when it is UTF-8, else as
// base64 with encoding "base64".
func jsonBody(b []byte) (body *string, encoding string) {
	if utf8.Valid(b) {
		s := string(b)
		return &s, ""
	}
	s := base64.StdEncoding.EncodeToString(b)
	return &s, "base64"
}

// sortedHeader returns h's names in order.
func sortedHeader(h http.Header) []string {
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// pastRetention reports whether rec may have reached the server, is not
// settled, and the server's key retention (ExpiresAt) has passed at now:
// the next Resume marks it expired without sending anything, as no status
// check can settle it any more. This is the test Resume applies.
func pastRetention(rec idem.Record, now time.Time) bool {
	return (rec.State == idem.StateInFlight || rec.State == idem.StateUnknown) &&
		!rec.ExpiresAt.IsZero() && now.After(rec.ExpiresAt)
}

// pastRetentionNote says what pastRetention means.
const pastRetentionNote = "past the server's retention: Resume marks it expired without sending"
