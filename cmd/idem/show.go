package main

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/operator"
)

var showCommand = &command{
	name:    "show",
	args:    "KEY|SCOPE/ID [--body] [--json]",
	summary: "print one operation: its record, stored response and history as a timeline",
	help: `
Prints one operation: every field of its record, the server's stored
response (status and headers) and its history. The request and response
bodies are printed only with --body: as text when they are UTF-8 text,
else in base64 (which is said).

"key header" is the key as every attempt, replay and status check sends
it, whoever sends it: the header's name and value, quoted (an RFC 8941
sf-string) or a bare token. A record journaled before idem kept the form
(schema 1) says "not journaled (sent in the resuming client's form)": the
client or "idem resume" that sends it uses its own. "attempts" adds the
times Go's HTTP transport re-sent an attempt on its own, when it did: each
may have reached the server. "last error" says why the operation is not
settled, such as what its last status check answered. An in_flight or
unknown operation whose "expires" has passed is flagged "past the server's
retention: Resume marks it expired without sending".

The history is a timeline, one line per change: its version and time, its
kind (create, send, answer, status, claim, stop, expire, operator, or
update for a journal written before changes had kinds), the state change
("=" when the state stayed), the attempt count, the HTTP status recorded,
the lease owner that made the change, and why: why an attempt was sent
again and how long it waited, what a status check answered or why it
failed, whose lease a claim took over and why it could, when a stopped
operation is due again, an operator's note.

The argument is first tried as a key. If no operation has that key and it
contains "/", it is split at its first "/" into a scope and an operation
ID: "default/checkout/cart-42" is operation "checkout/cart-42" of scope
"default". --json prints the same as one object, with each event's kind
and detail, and the key's form as key_form (journaled, header, quoted,
value).`,
	setup: func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		var withBody, asJSON bool
		fs.BoolVar(&withBody, "body", false, "print the request and response bodies too")
		fs.BoolVar(&asJSON, "json", false, "print one JSON object")
		return func(ctx context.Context, e *env, args []string) error {
			if err := wantArgs("show", args, "KEY or SCOPE/ID"); err != nil {
				return err
			}
			return withJournal(ctx, e, reading, func(j *openJournal) error {
				rec, err := resolve(ctx, e, j, args[0])
				if err != nil {
					return err
				}
				hist, err := j.History(ctx, rec.Key)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(e.stdout, showJSON(rec, hist, withBody, e.now()))
				}
				return showText(e.stdout, rec, hist, withBody, e.now())
			})
		}
	},
}

// resolve finds the operation that arg names: a key, else SCOPE/ID split
// at the first "/".
func resolve(ctx context.Context, e *env, j idem.Journal, arg string) (idem.Record, error) {
	// Keys and IDs are UTF-8 text; PostgreSQL refuses to even look for
	// other bytes, with an error about encodings.
	if !utf8.ValidString(arg) {
		return idem.Record{}, fmt.Errorf("no operation has key %q in journal %s: it is not UTF-8 text, and keys and IDs are", arg, e.journalName())
	}
	rec, err := j.Get(ctx, arg)
	if !errors.Is(err, idem.ErrNotFound) {
		return rec, err
	}
	scope, id, ok := strings.Cut(arg, "/")
	if !ok || scope == "" || id == "" {
		return idem.Record{}, fmt.Errorf("no operation has key %q in journal %s; name one by its key or as SCOPE/ID, such as default/checkout/cart-42", arg, e.journalName())
	}
	rec, err = j.Lookup(ctx, scope, id)
	if errors.Is(err, idem.ErrNotFound) {
		return idem.Record{}, fmt.Errorf("no operation has key %q, nor ID %q in scope %q, in journal %s", arg, id, scope, e.journalName())
	}
	return rec, err
}

func showJSON(rec idem.Record, hist []idem.Event, withBody bool, now time.Time) jsonRecord {
	out := newJSONRecord(rec, now)
	out.Fingerprint = rec.Fingerprint
	out.KeyForm = newJSONKeyForm(rec)
	out.Header = rec.Header
	n := len(rec.Body)
	out.BodyBytes = &n
	if withBody {
		out.Body, out.BodyEncoding = jsonBody(rec.Body)
	}
	if r := rec.Response; r != nil {
		out.Response = &jsonResponse{Status: r.StatusCode, Header: r.Header, Replayed: r.Replayed, BodyBytes: len(r.Body)}
		if withBody {
			out.Response.Body, out.Response.BodyEncoding = jsonBody(r.Body)
		}
	}
	out.History = make([]jsonEvent, len(hist))
	for i, ev := range hist {
		out.History[i] = jsonEvent{Version: ev.Version, At: utc(ev.At), Kind: ev.Kind.String(), Detail: ev.Detail,
			To: ev.To.String(), Attempt: ev.Attempt,
			StatusCode: ev.StatusCode, Error: ev.Error, Owner: ev.Owner}
		if ev.From != 0 {
			out.History[i].From = ev.From.String()
		}
	}
	return out
}

func showText(w io.Writer, rec idem.Record, hist []idem.Event, withBody bool, now time.Time) error {
	tw := newTable(w)
	field := func(name, value string) { row(tw, name, value) }
	field("key", rec.Key)
	field("key header", operator.KeyFormText(rec))
	field("scope", rec.Scope)
	field("id", rec.ID)
	field("state", rec.State.String())
	field("method", rec.Method)
	field("url", rec.URL)
	field("fingerprint", rec.Fingerprint)
	attempts := strconv.Itoa(rec.Attempts)
	if n := rec.TransportResends; n > 0 {
		attempts += fmt.Sprintf(", and %d re-send(s) by Go's HTTP transport on its own (a reused connection died before any reply; each may have reached the server)", n)
	}
	field("attempts", attempts)
	field("created", operator.FormatTime(rec.CreatedAt, now))
	field("updated", operator.FormatTime(rec.UpdatedAt, now))
	expires := operator.FormatTime(rec.ExpiresAt, now)
	if operator.PastRetention(rec, now) {
		expires += ": " + operator.PastRetentionNote
	}
	field("expires", expires)
	field("next attempt", operator.FormatTime(rec.NextAttemptAt, now))
	lease := "none"
	if rec.Lease.Owner != "" {
		lease = fmt.Sprintf("%s, epoch %d, until %s", rec.Lease.Owner, rec.Lease.Epoch, operator.FormatTime(rec.Lease.ExpiresAt, now))
		if !rec.Lease.Held(now) {
			lease += " (expired)"
		}
	}
	field("lease", lease)
	field("last error", rec.LastError)
	field("note", rec.Note)
	field("trace link", rec.Link)
	field("version", strconv.FormatInt(rec.Version, 10))
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nrequest header:")
	printHeader(w, rec.Header)
	printBody(w, "request body", rec.Body, withBody)

	if r := rec.Response; r != nil {
		status := fmt.Sprintf("%d %s", r.StatusCode, http.StatusText(r.StatusCode))
		if r.Replayed {
			status += " (replayed by the server)"
		}
		fmt.Fprintln(w, "\nresponse: "+strings.TrimSpace(status))
		fmt.Fprintln(w, "response header:")
		printHeader(w, r.Header)
		printBody(w, "response body", r.Body, withBody)
	} else {
		fmt.Fprintln(w, "\nresponse: none")
	}

	fmt.Fprintln(w, "\nhistory:")
	return printHistory(w, hist)
}

// printHistory prints the record's history as a timeline: one line per
// event, with its version and time, its kind, the state change ("=" when
// the state stayed), the attempt count, the status code, the lease owner
// that made the change, and why.
func printHistory(w io.Writer, hist []idem.Event) error {
	tw := newTable(w)
	row(tw, "  VERSION", "AT", "KIND", "CHANGE", "ATTEMPT", "STATUS", "OWNER", "WHY")
	prevError := ""
	for _, ev := range hist {
		status := "-"
		if ev.StatusCode != 0 {
			status = strconv.Itoa(ev.StatusCode)
		}
		row(tw, "  "+strconv.FormatInt(ev.Version, 10), ev.At.UTC().Format("2006-01-02 15:04:05.000Z07:00"),
			ev.Kind.String(), operator.StateChange(ev), strconv.Itoa(ev.Attempt), status, ev.Owner, operator.EventWhy(ev, prevError))
		prevError = ev.Error
	}
	return tw.Flush()
}

func printHeader(w io.Writer, h http.Header) {
	if len(h) == 0 {
		fmt.Fprintln(w, "  (none)")
		return
	}
	for _, name := range operator.SortedHeader(h) {
		for _, v := range h[name] {
			fmt.Fprintf(w, "  %s: %s\n", clean(name), clean(v))
		}
	}
}

// printBody prints a body's size and, when asked, the body: as text when
// it is, else in base64.
func printBody(w io.Writer, label string, b []byte, withBody bool) {
	switch {
	case len(b) == 0:
		fmt.Fprintf(w, "%s: empty\n", label)
	case !withBody:
		fmt.Fprintf(w, "%s: %d bytes (--body prints it)\n", label, len(b))
	case operator.IsText(b):
		fmt.Fprintf(w, "%s: %d bytes:\n%s", label, len(b), b)
		if b[len(b)-1] != '\n' {
			fmt.Fprintln(w)
		}
	default:
		fmt.Fprintf(w, "%s: %d bytes, not text, printed in base64:\n%s\n", label, len(b), base64.StdEncoding.EncodeToString(b))
	}
}
