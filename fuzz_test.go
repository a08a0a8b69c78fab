package idem_test

// Fuzz targets for the client's classification of attempts, its reading of
// Retry-After, and the refusal of bad journal files. The seeds (f.Add below
// and testdata/fuzz/<target>/) run as ordinary tests with `go test`;
// `go test -run '^$' -fuzz '^FuzzClassify$' .` fuzzes one target.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/journal"
)

// fzHeader parses header lines leniently: "Name: value" per line, with CR
// and surrounding spaces dropped and lines without a colon or a name
// skipped.
func fzHeader(b []byte) http.Header {
	h := http.Header{}
	for line := range strings.SplitSeq(string(b), "\n") {
		name, value, ok := strings.Cut(strings.TrimRight(line, "\r"), ":")
		if name = strings.TrimSpace(name); ok && name != "" {
			h.Add(name, strings.TrimSpace(value))
		}
	}
	return h
}

// fzKeyReused is an independent check that an answer carries the
// key-reused problem type: a problem+json content type (ASCII case
// insensitive) and a body that parses as a problem of that type.
func fzKeyReused(h http.Header, body []byte) bool {
	// Which content types are problem+json is ParseProblem's to say (and
	// FuzzParseProblem's to check); here only the table is checked.
	pr, ok := wire.ParseProblem(h.Get("Content-Type"), body)
	return ok && (pr.Type == wire.ProblemKeyReused || pr.Type == "https://hono-idempotency.dev/errors/fingerprint-mismatch")
}

func FuzzClassify(f *testing.F) {
	type seed struct {
		code         int
		hasResponse  bool
		header, body string
		written      bool
		errMsg       string
		hasErr       bool
		comment      string
	}
	reused := `{"type":"urn:idem:problem:key-reused","status":422}`
	for _, s := range []seed{
		{code: 0, errMsg: "dial tcp: connection refused", hasErr: true, comment: "not written"},
		{code: 0, written: true, errMsg: "read: connection reset by peer", hasErr: true, comment: "written, no answer"},
		{code: 0, written: true, comment: "no response and no error"},
		{code: 200, hasResponse: true, written: true, header: "Content-Type: application/json", body: `{"id":1}`},
		{code: 201, hasResponse: true, written: true, body: `{"id":1}`, errMsg: "unexpected EOF", hasErr: true, comment: "2xx cut off"},
		{code: 303, hasResponse: true, written: true, header: "Location: /orders/1"},
		{code: 409, hasResponse: true, written: true, header: "Retry-After: 2"},
		{code: 409, hasResponse: true, written: true, header: "Content-Type: application/problem+json", body: reused},
		{code: 409, hasResponse: true, written: true, body: `{"error":{"type":"idempotency_error","code":"PARAMS_MISMATCH"}}`},
		{code: 422, hasResponse: true, written: true, header: "Content-Type: application/problem+json", body: reused},
		{code: 422, hasResponse: true, written: true, header: "Content-Type: application/problem+json", body: `{"type":"https://example.com/validation"}`},
		{code: 422, hasResponse: true, written: true, header: "Content-Type: application/json", body: `{"error":"bad"}`},
		{code: 417, hasResponse: true, written: true},
		{code: 409, hasResponse: true, written: true, header: "Idempotent-Replayed: true", body: `{"error":"conflict"}`, comment: "a stored 409"},
		{code: 422, hasResponse: true, written: true, header: "Content-Type: application/problem+json", body: `{"type":"https://hono-idempotency.dev/errors/fingerprint-mismatch"}`},
		{code: 422, hasResponse: true, written: true, header: "Content-Type: text/plain", body: `{"error":"request with same idempotency key has different content"}`},
		{code: 307, hasResponse: true, written: true, header: "Location: https://elsewhere.example/"},
		{code: 400, hasResponse: true, written: true, body: `{"error":{"type":"idempotency_error"}}`},
		{code: 400, hasResponse: true, written: true, body: `{"error":"invalid"}`},
		{code: 429, hasResponse: true, written: true, header: "Retry-After: 120"},
		{code: 429, hasResponse: true, written: true, header: "Retry-After: Wed, 21 Oct 2015 07:28:00 GMT"},
		{code: 401, hasResponse: true, written: true},
		{code: 407, hasResponse: true, written: true},
		{code: 408, hasResponse: true, written: true},
		{code: 500, hasResponse: true, written: true, header: "Content-Type: text/plain", body: "oops"},
		{code: 502, hasResponse: true, written: true, header: "Idempotent-Replayed: true"},
		{code: 503, hasResponse: true, written: true, header: "Retry-After: 86401\nX-Idempotent-Replayed: false"},
		{code: 503, hasResponse: true, written: true, header: "Retry-After: -5"},
		{code: 500, hasResponse: true, written: true, header: "Content-Type: APPLICATION/PROBLEM+JSON; charset=utf-8", body: reused},
		{code: 404, hasResponse: true, written: true},
		{code: 101, hasResponse: true, written: true},
		{code: 999, hasResponse: true, written: true},
		{code: 0, hasResponse: true, written: true},
	} {
		f.Add(s.code, s.hasResponse, []byte(s.header), []byte(s.body), s.written, s.errMsg, s.hasErr)
	}
	f.Fuzz(func(t *testing.T, code int, hasResponse bool, header, body []byte, written bool, errMsg string, hasErr bool) {
		if code < 0 {
			code = -(code + 1)
		}
		code %= 1000
		var a idem.Attempt
		a.Written = written
		if hasErr {
			a.Err = errors.New(errMsg)
		}
		var h http.Header
		if hasResponse {
			h = fzHeader(header)
			a.Response = &http.Response{StatusCode: code, Header: h, Body: http.NoBody}
			a.Body = body
		}
		d := idem.Classify(a)
		t.Logf("attempt: response %v (HTTP %d, %v), written %v, err %v: %v after %v (%s)", hasResponse, code, h, written, a.Err, d.Verdict, d.RetryAfter, d.Reason)

		if d.Verdict < idem.Succeeded || d.Verdict > idem.Unknown || strings.HasPrefix(d.Verdict.String(), "Verdict(") {
			t.Fatalf("undefined verdict %v", d.Verdict)
		}
		if d.Reason == "" {
			t.Fatalf("verdict %v without a reason", d.Verdict)
		}
		if d.RetryAfter < 0 || d.RetryAfter > 24*time.Hour {
			t.Fatalf("RetryAfter %v is outside [0, 24h]", d.RetryAfter)
		}
		if d.RetryAfter > 0 && d.Verdict != idem.Retry && d.Verdict != idem.RetrySameKey && d.Verdict != idem.InProgress {
			t.Fatalf("verdict %v comes with a wait of %v", d.Verdict, d.RetryAfter)
		}
		if again := idem.Classify(a); again.Verdict != d.Verdict || again.Reason != d.Reason {
			t.Fatalf("Classify is not a pure function: %v (%s), then %v (%s)", d.Verdict, d.Reason, again.Verdict, again.Reason)
		}

		if !hasResponse {
			switch {
			case a.Err != nil && !written && d.Verdict != idem.Retry:
				t.Fatalf("an attempt never written is %v, want retry", d.Verdict)
			case a.Err != nil && written && d.Verdict != idem.Unknown:
				t.Fatalf("an attempt written and left unanswered is %v, want unknown", d.Verdict)
			case d.Verdict == idem.Succeeded || d.Verdict == idem.Rejected || d.Verdict == idem.KeyConflict:
				t.Fatalf("an attempt without an answer is settled as %v", d.Verdict)
			case d.RetryAfter != 0:
				t.Fatalf("an attempt without an answer waits %v", d.RetryAfter)
			}
			return
		}
		if a.Err != nil {
			if d.Verdict != idem.Unknown {
				t.Fatalf("HTTP %d whose body was cut off is %v, want unknown", code, d.Verdict)
			}
			return
		}
		success := code >= 200 && code < 300 || code == http.StatusSeeOther
		if success != (d.Verdict == idem.Succeeded) {
			t.Fatalf("HTTP %d is %v", code, d.Verdict)
		}
		if success {
			return
		}
		// Below, the rows of Classify's table.
		reused := fzKeyReused(h, body)
		refused := code == http.StatusTooManyRequests || code == http.StatusUnauthorized || code == http.StatusProxyAuthRequired
		if d.Verdict == idem.Retry && !refused {
			t.Fatalf("HTTP %d was answered, and is not one that refuses before processing, yet it is %v", code, d.Verdict)
		}
		// A key conflict is recognised by a problem type at any status that is
		// not a success, or
		// by a documented body at 400, 409 and 422: never by a status
		// alone.
		replayed := wire.Replayed(h)
		var want []idem.Verdict
		switch {
		case code >= 100 && code < 200: // no final answer
			want = []idem.Verdict{idem.Unknown}
		case reused:
			want = []idem.Verdict{idem.KeyConflict}
		case code == http.StatusBadRequest, code == http.StatusUnprocessableEntity:
			want = []idem.Verdict{idem.KeyConflict, idem.Rejected}
		case code == http.StatusConflict && replayed:
			want = []idem.Verdict{idem.KeyConflict, idem.Rejected}
		case code == http.StatusConflict:
			want = []idem.Verdict{idem.KeyConflict, idem.InProgress}
		case replayed:
			want = []idem.Verdict{idem.Rejected}
		case refused:
			want = []idem.Verdict{idem.Retry}
		case code >= 500 && code <= 599, code == http.StatusRequestTimeout:
			want = []idem.Verdict{idem.RetrySameKey}
		case code < 500:
			want = []idem.Verdict{idem.Rejected}
		default: // 600-999: not HTTP statuses; any verdict that is not success
			return
		}
		for _, v := range want {
			if d.Verdict == v {
				return
			}
		}
		t.Fatalf("HTTP %d (key reused: %v) is %v, want one of %v", code, reused, d.Verdict, want)
	})
}

func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{
		"", " ", "0", "-1", "1", " 120 ", "+5", "86400", "86401", "9223372036854775807", "99999999999999999999",
		"1.5", "0x10", "soon",
		"Wed, 21 Oct 2015 07:28:00 GMT", // in the past
		"Thu, 01 Jan 2026 00:00:30 GMT", // 30 s after fzNow
		"Thursday, 01-Jan-26 00:01:00 GMT",
		"Thu Jan  1 00:02:00 2026",
		"Thu, 01 Jan 2026 00:00:00 GMT", // exactly now
	} {
		f.Add(s)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		h := http.Header{}
		h.Set("Retry-After", v)
		d := idem.RetryAfter(h, now)
		if d < 0 || d > 24*time.Hour {
			t.Fatalf("RetryAfter(%q) = %v, outside [0, 24h]", v, d)
		}
		// Delay-seconds are read exactly, up to a day.
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			want := 24 * time.Hour
			switch {
			case n <= 0:
				want = 0
			case n < 24*60*60:
				want = time.Duration(n) * time.Second
			}
			if d != want {
				t.Fatalf("RetryAfter(%q) = %v, want %v", v, d, want)
			}
		}
		// A date in the past or now means no wait; one within a day is
		// read exactly.
		if at, err := http.ParseTime(strings.TrimSpace(v)); err == nil {
			switch wait := at.Sub(now); {
			case wait <= 0 && d != 0:
				t.Fatalf("RetryAfter(%q) = %v for a date that has passed", v, d)
			case wait > 0 && wait <= 24*time.Hour && d != wait:
				t.Fatalf("RetryAfter(%q) = %v, want %v", v, d, wait)
			}
		}
		if (http.Header{}).Get("Retry-After") != "" || idem.RetryAfter(http.Header{}, now) != 0 {
			t.Fatal("RetryAfter without the header is not zero")
		}
	})
}

// The bases FuzzOpenSQLite corrupts: its first input byte modulo
// fzBaseCount chooses one.
const (
	fzBaseRaw       = iota // the rest of the input is the file
	fzBaseJournal          // a journal with records, patched
	fzBaseEmpty            // a freshly created journal, patched
	fzBaseForeign          // another program's SQLite database, patched
	fzBaseTruncated        // the journal with records, cut short, then patched
	fzBaseCount
)

// fzBases holds the files of the bases, built once per process. They are
// the same bytes on every run (fixed times, fixed keys), so that a crasher
// found by one run reproduces in the next.
var fzBases struct {
	once    sync.Once
	err     error
	journal []byte
	empty   []byte
	foreign []byte
	records []idem.Record // the journal's records, as Get returns them
}

var fzTime = time.UnixMilli(1_767_225_600_000) // 2026-01-01T00:00:00Z

// fzRecords returns the records of the journal base with their histories,
// made by the journal's own rules: one of each kind of row the journal
// stores.
func fzRecords() ([]idem.Record, [][]idem.Event, error) {
	var recs []idem.Record
	var events [][]idem.Event
	add := func(intent idem.Record, update func(idem.Record) idem.Record) error {
		rec, created, err := journal.NewRecord(intent, fzTime, 0)
		if err != nil {
			return err
		}
		evs := []idem.Event{created}
		if update != nil {
			var ev idem.Event
			if rec, ev, err = journal.ApplyUpdate(rec, update(rec), fzTime.Add(40*time.Millisecond), idem.Event{}, nil); err != nil {
				return err
			}
			evs = append(evs, ev)
		}
		recs, events = append(recs, rec), append(events, evs)
		return nil
	}
	const fp = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	hdr := http.Header{"Content-Type": {"application/json"}}
	errs := []error{
		// Succeeded, UUID key (stored as 16 bytes), leased while in flight.
		add(idem.Record{Key: "3f1c9a4e-6d2b-4e8f-9a7c-1b2d3e4f5a6b", Scope: "acme", ID: "order-1", Method: "POST",
			URL: "https://api.example.com/orders", Header: hdr, Body: []byte(`{"amount":100}`), Fingerprint: fp, KeyHeader: "Idempotency-Key",
			State: idem.StateInFlight, Attempts: 1, ExpiresAt: fzTime.Add(24 * time.Hour),
			Lease: idem.Lease{Owner: "worker-1", ExpiresAt: fzTime.Add(30 * time.Second)}},
			func(r idem.Record) idem.Record {
				r.State = idem.StateSucceeded
				r.Response = &idem.Response{StatusCode: 201, Header: hdr, Body: []byte(`{"id":1}`)}
				return r
			}),
		// Pending, a key that is not a UUID, a binary body.
		add(idem.Record{Key: "order-42", Scope: "acme", ID: "order-2", Method: "PUT",
			URL: "https://api.example.com/orders/42", Body: []byte{0, 1, 2, 0xff}, Fingerprint: "not-hex", KeyHeader: "X-Request-Key", KeyQuoted: true,
			State: idem.StatePending, NextAttemptAt: fzTime}, nil),
		// Rejected with a replayed problem.
		add(idem.Record{Key: "a4b1c3d2-0000-4000-8000-000000000001", Scope: "other", ID: "refund-1", Method: "POST",
			URL: "https://api.example.com/refunds", Fingerprint: fp, KeyHeader: "Idempotency-Key", State: idem.StateInFlight, Attempts: 2,
			ExpiresAt: fzTime.Add(time.Hour)},
			func(r idem.Record) idem.Record {
				r.State = idem.StateRejected
				r.Response = &idem.Response{StatusCode: 422, Replayed: true,
					Header: http.Header{"Content-Type": {"application/problem+json"}},
					Body:   []byte(`{"type":"urn:idem:problem:key-reused"}`)}
				return r
			}),
		// Unknown, waiting for a status check.
		add(idem.Record{Key: "k-unknown", Scope: "acme", ID: "order-3", Method: "POST", URL: "https://api.example.com/orders",
			Fingerprint: fp, KeyHeader: "Idempotency-Key", State: idem.StateInFlight, Attempts: 1, ExpiresAt: fzTime.Add(time.Hour)},
			func(r idem.Record) idem.Record {
				r.State, r.LastError, r.NextAttemptAt = idem.StateUnknown, "read: connection reset by peer", fzTime.Add(time.Second)
				return r
			}),
	}
	return recs, events, errors.Join(errs...)
}

func fzBuildBases() error {
	dir, err := os.MkdirTemp("", "idem-fuzz-bases-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()

	empty := filepath.Join(dir, "empty.db")
	j, err := idem.OpenSQLite(empty)
	if err != nil {
		return err
	}
	if err := j.Close(); err != nil {
		return err
	}

	full := filepath.Join(dir, "journal.db")
	if j, err = idem.OpenSQLite(full); err != nil {
		return err
	}
	recs, events, err := fzRecords()
	if err != nil {
		return errors.Join(err, j.Close())
	}
	err = idem.ImportForBenchmark(ctx, j, len(recs), func(i int) (idem.Record, []idem.Event, error) {
		return recs[i], events[i], nil
	})
	if err := errors.Join(err, j.Close()); err != nil {
		return err
	}

	foreign := filepath.Join(dir, "foreign.db")
	db, err := sql.Open("sqlite3", "file:"+foreign)
	if err != nil {
		return err
	}
	_, err = db.Exec(`PRAGMA application_id = 0x12345678; PRAGMA user_version = 4;
		CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT); INSERT INTO notes (text) VALUES ('hello'), ('world')`)
	if err := errors.Join(err, db.Close()); err != nil {
		return err
	}

	for _, f := range []struct {
		path string
		dst  *[]byte
	}{{empty, &fzBases.empty}, {full, &fzBases.journal}, {foreign, &fzBases.foreign}} {
		if *f.dst, err = os.ReadFile(f.path); err != nil {
			return err
		}
	}
	fzBases.records = recs
	return nil
}

// fzPatch overwrites base, a copy, with the patches in p: each is a 16-bit
// big-endian offset (modulo the file's length), a length n, then up to n
// bytes.
func fzPatch(base, p []byte) []byte {
	out := bytes.Clone(base)
	for len(p) >= 3 && len(out) > 0 {
		off := int(binary.BigEndian.Uint16(p)) % len(out)
		n := int(p[2])
		p = p[3:]
		n = min(n, len(p))
		copy(out[off:], p[:n])
		p = p[n:]
	}
	return out
}

// fzFirstDiff returns the offset of the first byte where a and b differ.
func fzFirstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// fzJournalInput builds a FuzzOpenSQLite input: base, then patches of
// (offset, bytes).
func fzJournalInput(base byte, patches ...any) []byte {
	in := []byte{base}
	for i := 0; i+1 < len(patches); i += 2 {
		b := patches[i+1].([]byte)
		in = binary.BigEndian.AppendUint16(in, uint16(patches[i].(int)))
		in = append(in, byte(len(b)))
		in = append(in, b...)
	}
	return in
}

func FuzzOpenSQLite(f *testing.F) {
	u32 := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	sqliteHeader := func(appID uint32, userVersion uint32) []byte {
		h := make([]byte, 100)
		copy(h, "SQLite format 3\x00")
		binary.BigEndian.PutUint16(h[16:], 4096) // page size
		h[18], h[19], h[21], h[22], h[23] = 1, 1, 64, 32, 32
		binary.BigEndian.PutUint32(h[28:], 1) // pages
		binary.BigEndian.PutUint32(h[44:], 4) // schema format
		binary.BigEndian.PutUint32(h[56:], 1) // UTF-8
		binary.BigEndian.PutUint32(h[60:], userVersion)
		binary.BigEndian.PutUint32(h[68:], appID)
		return h
	}
	for _, in := range [][]byte{
		nil,         // an empty file: a new journal
		{fzBaseRaw}, // the same
		append([]byte{fzBaseRaw}, "hello, this is not a database\n"...),
		append([]byte{fzBaseRaw}, sqliteHeader(0x12345678, 0)...), // a lone header of another application
		append([]byte{fzBaseRaw}, sqliteHeader(0x69646d6a, 0)...), // a lone header with the journal's application_id
		{fzBaseJournal},         // the journal as written
		{fzBaseEmpty},           // a new journal as written
		{fzBaseForeign},         // another program's database
		{fzBaseTruncated, 0, 0}, // the journal cut to nothing
		{fzBaseTruncated, 0x10, 0x00},
		fzJournalInput(fzBaseEmpty, 60, u32(99)),                            // user_version 99: written by a newer idem
		fzJournalInput(fzBaseJournal, 60, u32(99)),                          // the same, with records
		fzJournalInput(fzBaseJournal, 68, u32(0x12345678)),                  // another application_id
		fzJournalInput(fzBaseJournal, 68, u32(0)),                           // no application_id
		fzJournalInput(fzBaseJournal, 60, u32(0)),                           // marked as a journal, without a schema version
		fzJournalInput(fzBaseEmpty, 0, []byte("SQLite format 4")),           // bad magic
		fzJournalInput(fzBaseJournal, 16, []byte{0x03, 0x00}),               // bad page size
		fzJournalInput(fzBaseJournal, 18, []byte{1, 1}),                     // rollback journal mode in the header
		fzJournalInput(fzBaseJournal, 28, u32(1)),                           // wrong page count
		fzJournalInput(fzBaseJournal, 4096, bytes.Repeat([]byte{0xff}, 64)), // a damaged second page
		fzJournalInput(fzBaseJournal, 8192+8, bytes.Repeat([]byte{0}, 200)), // a damaged table page
		fzJournalInput(fzBaseForeign, 68, u32(0x69646d6a)),                  // another program's tables with our application_id
	} {
		f.Add(in)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		// A panic fails this input only, instead of ending the test binary
		// and every test after it.
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("panic: %v\n%s", p, debug.Stack())
			}
		}()
		fzBases.once.Do(func() { fzBases.err = fzBuildBases() })
		if fzBases.err != nil {
			t.Fatalf("building the journal bases: %v", fzBases.err)
		}
		var data []byte
		var base []byte // the unpatched base, when there is one
		if len(in) > 0 {
			switch in[0] % fzBaseCount {
			case fzBaseRaw:
				data = in[1:]
			case fzBaseJournal:
				base, data = fzBases.journal, fzPatch(fzBases.journal, in[1:])
			case fzBaseEmpty:
				base, data = fzBases.empty, fzPatch(fzBases.empty, in[1:])
			case fzBaseForeign:
				data = fzPatch(fzBases.foreign, in[1:])
			case fzBaseTruncated:
				n := 0
				if len(in) >= 3 {
					n = int(binary.BigEndian.Uint16(in[1:])) % len(fzBases.journal)
					in = in[2:]
				}
				data = fzPatch(fzBases.journal[:n], in[1:])
			}
		}
		path := filepath.Join(t.TempDir(), "journal.db")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		j, err := idem.OpenSQLite(path)
		t.Logf("OpenSQLite of %d bytes: %v", len(data), err)
		if err != nil {
			// Every property of a refusal is checked, so that one failure
			// does not hide another.
			var fe *idem.FileError
			if !errors.As(err, &fe) {
				t.Errorf("OpenSQLite refused the file with %T, not a *FileError: %v", err, err)
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("OpenSQLite's error does not name %s: %v", path, err)
			}
			known := false
			for _, kind := range []error{idem.ErrNotJournal, idem.ErrSchemaTooNew, idem.ErrJournalCorrupt, idem.ErrJournalPath} {
				known = known || errors.Is(err, kind)
			}
			if !known {
				t.Errorf("OpenSQLite refused the file with an error of no known kind: %v", err)
			}
			if base != nil && bytes.Equal(data, base) {
				t.Errorf("OpenSQLite refused an unchanged journal: %v", err)
			}
			after, rerr := os.ReadFile(path)
			if rerr != nil {
				t.Fatal(rerr)
			}
			if !bytes.Equal(after, data) {
				t.Errorf("OpenSQLite changed the file it refused (%d bytes, then %d; first difference at byte %d): %v",
					len(data), len(after), fzFirstDiff(data, after), err)
			}
			return
		}
		ctx := context.Background()
		intact := bytes.Equal(data, fzBases.journal)
		for _, want := range fzBases.records {
			got, err := j.Get(ctx, want.Key)
			if intact && (err != nil || !reflect.DeepEqual(got, want)) {
				t.Errorf("Get(%s) on the intact journal = %+v, %v; want %+v", want.Key, got, err, want)
			}
		}
		n := 0
		for _, err := range j.List(ctx, idem.Filter{}) {
			if n++; err != nil || n > 1000 {
				break
			}
		}
		if intact && n != len(fzBases.records) {
			t.Errorf("List on the intact journal read %d records, want %d", n, len(fzBases.records))
		}
		if err := j.Close(); err != nil {
			t.Fatalf("Close of a journal OpenSQLite accepted: %v", err)
		}
		// A file accepted once is accepted again.
		j, err = idem.OpenSQLite(path)
		if err != nil {
			t.Fatalf("OpenSQLite accepted the file, then refused it once closed: %v", err)
		}
		if err := j.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
}
