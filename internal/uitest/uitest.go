// Package uitest journals operations for the tests of idem ui (the
// handler's tests in internal/webui and the browser tests in module
// browser): a real SQLite journal filled by the real client against the
// real test server (internal/testserver), so that the states, the
// histories and the timelines are what an application leaves, plus
// hostile records written straight to the journal (which holds whatever
// an application sent: markup, invalid UTF-8, NUL bytes, very long
// values).
package uitest

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
)

// Names of the fixture's operations, the keys of Fixture.Keys.
const (
	Succeeded       = "succeeded"        // one attempt, 201
	SucceededStatus = "succeeded-status" // the answer lost, a status check found it
	SucceededWait   = "succeeded-wait"   // a 503 with Retry-After, a wait, a second attempt
	Rejected        = "rejected"         // a 400
	Unknown         = "unknown"          // the answer lost, the status check failed
	Unknown2        = "unknown-2"        // another, for a second reconcile
	Pending         = "pending"          // journaled by Begin, not sent
	Canceled        = "canceled"         // Begin, then Cancel
	InFlight        = "in-flight"        // left in_flight by a process that died
	HostileMarkup   = "hostile-markup"   // markup in its ID, scope, header and body (via the client)
	HostileBytes    = "hostile-bytes"    // NUL and invalid UTF-8 everywhere, a response too
	HostileLong     = "hostile-long"     // a 20,000-byte ID, a 3 MB-wide header value
)

// Hostile values. An escaping bug turns them into elements a test can
// look for: an <img onerror> or a <script> that runs.
const (
	MarkupID     = `<script>window.pwned=1</script>"><img src=x onerror="window.pwned=2">`
	MarkupScope  = `tenant"><b id=pwned3>`
	MarkupHeader = `"><script>window.pwned=4</script>`
	MarkupBody   = `</pre></textarea><script>window.pwned=5</script><img src=x onerror="window.pwned=6">`
	MarkupLink   = `"><script>window.pwned=10</script>`
)

// BytesID and BytesBody hold a NUL and bytes that are not UTF-8.
var (
	BytesID   = "bytes/\x00\xff\xfe<script>window.pwned=7</script>"
	BytesBody = []byte("\x00\xff\xfe<script>window.pwned=8</script>\x80binary")
	LongID    = "long/" + strings.Repeat("A<b>", 5000)
)

// Fixture is a journal built by Build or Fill.
type Fixture struct {
	// Path is the journal file, closed; empty after Fill.
	Path string
	// Keys maps the names above to the operations' keys.
	Keys map[string]string
}

// Build journals the fixture's operations in a new journal at path, and
// closes it.
func Build(t testing.TB, path string) Fixture {
	t.Helper()
	j, err := idem.OpenSQLite(path)
	if err != nil {
		t.Fatalf("uitest: %v", err)
	}
	defer j.Close()
	f := Fill(t, j, false)
	f.Path = path
	return f
}

// Fill journals the fixture's operations in j, a journal of any kind (the
// browser tests fill a PostgreSQL one too), which it leaves open. textOnly
// is for a journal whose text columns hold only UTF-8 without NUL
// (PostgreSQL's text): the hostile-bytes operation then carries its markup
// in valid text instead.
func Fill(t testing.TB, j idem.Journal, textOnly bool) Fixture {
	t.Helper()
	ctx := context.Background()
	srv := testserver.Start(t)
	// One status check per call, and a next one due seconds later, past
	// what the call waits for: an answer lost with the status endpoint
	// down leaves the operation unknown.
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.StatusURL),
		Retry: idem.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Second,
			MaxRetryAfter: 2 * time.Second, MaxStatusChecks: 1},
		AttemptTimeout: 5 * time.Second,
		// Without keep-alive, a dropped answer is not re-sent by Go's
		// transport on its own (it re-sends only on a reused connection):
		// it is an outcome the client does not know.
		HTTPClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}})
	if err != nil {
		t.Fatalf("uitest: %v", err)
	}
	defer c.Close()
	f := Fixture{Keys: map[string]string{}}
	do := func(name string, op idem.Op, want error) {
		t.Helper()
		_, err := c.Do(ctx, op)
		if (want == nil && err != nil) || (want != nil && !errors.Is(err, want)) {
			t.Fatalf("uitest: %s: Do: %v, want %v", name, err, want)
		}
		rec, err := c.Lookup(ctx, "default", op.ID)
		if err != nil {
			t.Fatalf("uitest: %s: Lookup: %v", name, err)
		}
		f.Keys[name] = rec.Key
	}
	begin := func(name string, op idem.Op) *idem.Operation {
		t.Helper()
		o, err := c.Begin(ctx, op)
		if err != nil {
			t.Fatalf("uitest: %s: Begin: %v", name, err)
		}
		f.Keys[name] = o.Key()
		return o
	}

	do(Succeeded, order("checkout/cart-1", "book"), nil)
	srv.Inject(testserver.DropAfterCommit)
	do(SucceededStatus, order("checkout/cart-2", "lamp"), nil)
	srv.Inject(testserver.UnavailableBeforeCommit)
	do(SucceededWait, order("checkout/cart-3", "desk"), nil)
	do(Rejected, order("checkout/cart-4", ""), idem.ErrRejected)
	srv.Inject(testserver.DropAfterCommit)
	srv.InjectStatus(testserver.StatusDown)
	do(Unknown, order("pay/invoice-7", "chair"), idem.ErrOutcomeUnknown)
	srv.Inject(testserver.DropAfterCommit)
	srv.InjectStatus(testserver.StatusDown)
	do(Unknown2, order("pay/invoice-8", "sofa"), idem.ErrOutcomeUnknown)
	begin(Pending, order("later/cart-5", "rug"))
	begin(Canceled, order("later/cart-6", "vase"))
	if err := c.Cancel(ctx, f.Keys[Canceled]); err != nil {
		t.Fatalf("uitest: cancel: %v", err)
	}
	// The client refuses control characters in IDs, not markup.
	hostile := order(MarkupID, "x")
	hostile.Scope = MarkupScope
	hostile.Header.Set("X-Note", MarkupHeader)
	hostile.Body = []byte(MarkupBody)
	begin(HostileMarkup, hostile)

	// A process that died mid-attempt, and what the client would refuse:
	// written to the journal directly, which holds whatever it is given.
	f.Keys[InFlight] = put(t, j, idem.Record{Scope: "default", ID: "crashed/cart-9", Body: []byte(`{"item":"bed","quantity":1}`),
		State: idem.StateInFlight, Attempts: 1, ExpiresAt: time.Now().Add(24 * time.Hour)}, nil)
	bytesScope, bytesID, binHeader := "bytes\x00\xff", BytesID, "\x00\xff<script>window.pwned=9</script>"
	if textOnly {
		bytesScope, bytesID, binHeader = TextOnly(bytesScope), TextOnly(bytesID), TextOnly(binHeader)
	}
	f.Keys[HostileBytes] = put(t, j, idem.Record{Scope: bytesScope, ID: bytesID, Body: BytesBody,
		Header: http.Header{"X-Bin": {binHeader}, "Authorization": {"Bearer secret-in-journal"}},
		Link:   MarkupLink, State: idem.StateInFlight, Attempts: 1, ExpiresAt: time.Now().Add(24 * time.Hour)},
		&idem.Response{StatusCode: 200, Body: BytesBody,
			Header: http.Header{"Content-Type": {"text/html"}, "X-Evil": {MarkupHeader}, "Set-Cookie": {"session=secret-cookie"}}})
	f.Keys[HostileLong] = put(t, j, idem.Record{Scope: "default", ID: LongID, Body: []byte(strings.Repeat("x", 3<<20/4)),
		Header: http.Header{"X-Long": {strings.Repeat("v", 100_000)}}, State: idem.StatePending}, nil)
	return f
}

// TextOnly is s with its NUL bytes and invalid UTF-8 replaced by U+FFFD.
func TextOnly(s string) string {
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", "\uFFFD"), "\uFFFD")
}

// order is a POST /orders of the test server's application; an empty
// item is refused with 400.
func order(id, item string) idem.Op {
	return idem.Op{ID: id, URL: "/orders", Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"item":"` + item + `","quantity":1}`)}
}

// put creates rec in j directly, as a journal accepts it, and settles it
// with resp when resp is not nil.
func put(t testing.TB, j idem.Journal, rec idem.Record, resp *idem.Response) string {
	t.Helper()
	ctx := context.Background()
	rec.Key = uuid.NewString()
	rec.Method, rec.URL, rec.KeyHeader = http.MethodPost, "https://api.example.com/orders", "Idempotency-Key"
	rec.Fingerprint = idem.Fingerprint(rec.Method, rec.URL, rec.Header, nil, rec.Body)
	got, _, err := j.Create(ctx, rec)
	if err != nil {
		t.Fatalf("uitest: create %q: %v", rec.ID, err)
	}
	if resp != nil {
		got.State, got.Response = idem.StateSucceeded, resp
		if _, err := j.Update(ctx, got, idem.Durable, idem.Event{Kind: idem.EventAnswer, Detail: "answered"}); err != nil {
			t.Fatalf("uitest: update %q: %v", rec.ID, err)
		}
	}
	return rec.Key
}
