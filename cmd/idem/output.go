package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/operator"
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
// drive the terminal, format characters (unicode.Cf: the bidirectional
// overrides and isolates U+202A-202E and U+2066-2069, the marks U+200E
// and U+200F, zero-width characters), which reorder or hide what the
// terminal shows, so that "refund/\u202Edecnalab-ton" would read as
// "refund/not-balanced", and empty cells, which would shift columns.
// What is printed is then the ID to type, but for the '?'s.
func clean(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == utf8.RuneError {
			return '?'
		}
		return r
	}, s)
	if s == "" {
		return "-"
	}
	return s
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
		Version: rec.Version, PastRetention: operator.PastRetention(rec, now),
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
