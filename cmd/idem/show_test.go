package main

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func TestShowByKey(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)
	rec := recs[rSucceeded]
	r := idemOn(t, path, "show", rec.Key)
	requireOK(t, r)
	for _, want := range []string{
		"key           " + rec.Key,
		"scope         default",
		"id            checkout/cart-41",
		"state         succeeded",
		"method        POST",
		"url           https://api.example.com/orders",
		"fingerprint   " + rec.Fingerprint,
		"attempts      1",
		"lease         none",
		"version       2",
		"request header:\n  Content-Type: application/json\n",
		"request body: 11 bytes (--body prints it)",
		"response: 201 Created (replayed by the server)",
		"  X-Request-Id: req-abc\n",
		"response body: 37 bytes (--body prints it)",
	} {
		assert.Contains(t, r.stdout, want)
	}
	// History: the creation as in_flight, then the answer (written by
	// put, whose updates have no kind of their own).
	hist := r.stdout[strings.Index(r.stdout, "history:"):]
	assert.Regexp(t, `(?m)^  1 +\S+ \S+ +create +→ in_flight +1 +- `, hist)
	assert.Regexp(t, `(?m)^  2 +\S+ \S+ +update +in_flight → succeeded +1 +201 `, hist)
	// Bodies only with --body.
	assert.NotContains(t, r.stdout, responseBody)
	assert.NotContains(t, r.stdout, `{"cart":41}`)

	r = idemOn(t, path, "show", rec.Key, "--body")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "request body: 11 bytes:\n{\"cart\":41}\n")
	assert.Contains(t, r.stdout, "response body: 37 bytes:\n"+responseBody+"\n")

	// The full ID and last error, which ls shortens.
	r = idemOn(t, path, "show", recs[rUnknown].Key)
	requireOK(t, r)
	assert.Contains(t, r.stdout, "id            "+longID+"\n")
	assert.Contains(t, r.stdout, "last error    "+longError+"\n")
	assert.Contains(t, r.stdout, "response: none")
}

func TestShowByScopeAndID(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)
	// IDs contain "/": the argument is split at its first "/" only.
	r := idemOn(t, path, "show", "default/checkout/cart-42")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "key           "+recs[rPending].Key+"\n")
	assert.Contains(t, r.stdout, "state         pending\n")

	r = idemOn(t, path, "show", "tenant-b/ship/s-9", "--json")
	requireOK(t, r)
	var got jsonRecord
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	assert.Equal(t, recs[rExpired].Key, got.Key)
	assert.Equal(t, "ship/s-9", got.ID)
	assert.Equal(t, "expired", got.State)
	require.Len(t, got.History, 3)
	assert.Equal(t, []string{"in_flight", "unknown", "expired"}, []string{got.History[0].To, got.History[1].To, got.History[2].To})
	assert.Equal(t, "", got.History[0].From)
	assert.Equal(t, "in_flight", got.History[1].From)

	// The same ID in another scope is another operation.
	r = idemOn(t, path, "show", "tenant-b/checkout/cart-42")
	requireOneLineError(t, r, 1, `nor ID "checkout/cart-42" in scope "tenant-b"`)
}

func TestShowTriesKeyFirst(t *testing.T) {
	t.Parallel()
	path, j := openTestJournal(t)
	byID := put(t, j, op{scope: "default", id: "checkout/cart-42"})
	// A key that reads like SCOPE/ID names its own operation.
	byKey := put(t, j, op{key: "default/checkout/cart-42", scope: "other", id: "trap"})
	require.NoError(t, j.Close())

	r := idemOn(t, path, "show", "default/checkout/cart-42", "--json")
	requireOK(t, r)
	var got jsonRecord
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	assert.Equal(t, byKey.Key, got.Key)
	assert.Equal(t, "trap", got.ID)

	r = idemOn(t, path, "show", byID.Key, "--json")
	requireOK(t, r)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	assert.Equal(t, "checkout/cart-42", got.ID)
}

func TestShowJSONBodies(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)

	// Without --body: sizes, headers and status, never the bodies.
	r := idemOn(t, path, "show", recs[rSucceeded].Key, "--json")
	requireOK(t, r)
	var got jsonRecord
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	assert.Nil(t, got.Body)
	require.NotNil(t, got.BodyBytes)
	assert.Equal(t, 11, *got.BodyBytes)
	require.NotNil(t, got.Response)
	assert.Equal(t, 201, got.Response.Status)
	assert.True(t, got.Response.Replayed)
	assert.Equal(t, http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"req-abc"}}, got.Response.Header)
	assert.Equal(t, 37, got.Response.BodyBytes)
	assert.Nil(t, got.Response.Body)
	assert.Equal(t, http.Header{"Content-Type": {"application/json"}}, got.Header)
	assert.NotContains(t, r.stdout, "9812")

	// With --body: text as text.
	r = idemOn(t, path, "show", recs[rSucceeded].Key, "--json", "--body")
	requireOK(t, r)
	got = jsonRecord{}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	require.NotNil(t, got.Body)
	assert.Equal(t, `{"cart":41}`, *got.Body)
	assert.Empty(t, got.BodyEncoding)
	require.NotNil(t, got.Response.Body)
	assert.Equal(t, responseBody, *got.Response.Body)

	// Bytes that are not UTF-8 come in base64, and say so.
	r = idemOn(t, path, "show", recs[rBinary].Key, "--json", "--body")
	requireOK(t, r)
	got = jsonRecord{}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	assert.Equal(t, "base64", got.BodyEncoding)
	b, err := base64.StdEncoding.DecodeString(*got.Body)
	require.NoError(t, err)
	assert.Equal(t, binaryBody, b)
	assert.Equal(t, "base64", got.Response.BodyEncoding)
	b, err = base64.StdEncoding.DecodeString(*got.Response.Body)
	require.NoError(t, err)
	assert.Equal(t, binaryBody, b)
}

func TestShowTextBinaryBody(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)
	r := idemOn(t, path, "show", recs[rBinary].Key)
	requireOK(t, r)
	assert.Contains(t, r.stdout, "request body: 6 bytes (--body prints it)")
	assert.NotContains(t, r.stdout, base64.StdEncoding.EncodeToString(binaryBody))

	r = idemOn(t, path, "show", recs[rBinary].Key, "--body")
	requireOK(t, r)
	enc := base64.StdEncoding.EncodeToString(binaryBody)
	assert.Contains(t, r.stdout, "request body: 6 bytes, not text, printed in base64:\n"+enc+"\n")
	assert.Contains(t, r.stdout, "response body: 6 bytes, not text, printed in base64:\n"+enc+"\n")
	assert.NotContains(t, r.stdout, string(binaryBody))
}

func TestShowEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	path, j := openTestJournal(t)
	// A body that would drive the terminal is not printed raw.
	escape := []byte("\x1b]0;pwned\x07text")
	rec := put(t, j, op{id: "term/1", body: escape, lastError: "line one\nline two\x1b[2J",
		path: []idem.State{idem.StateInFlight, idem.StateUnknown},
		why:  idem.Event{Kind: idem.EventStatus, Detail: "check 1: failed: \x1b[31mred\r\n"}})
	require.NoError(t, j.Close())

	r := idemOn(t, path, "show", rec.Key, "--body")
	requireOK(t, r)
	assert.NotContains(t, r.stdout, "\x1b")
	assert.Contains(t, r.stdout, "not text, printed in base64:\n"+base64.StdEncoding.EncodeToString(escape))
	assert.Contains(t, r.stdout, "last error    line one?line two?[2J\n")
	// The history's details too: one line per event.
	assert.Regexp(t, `(?m)^  2 +\S+ \S+ +status +in_flight → unknown +1 +- +- +check 1: failed: \?\[31mred\?\?$`, r.stdout)

	r = idemOn(t, path, "show", rec.Key, "--json")
	requireOK(t, r)
	assert.NotContains(t, r.stdout, "\x1b")
	assert.Contains(t, r.stdout, `"detail":"check 1: failed: \u001b[31mred\r\n"`)

	r = idemOn(t, path, "ls")
	requireOK(t, r)
	assert.NotContains(t, r.stdout, "\x1b")
}

// An operation that may have reached the server, is not settled, and
// whose server retention has passed is flagged by show and ls: the next
// resume marks it expired without sending anything, and it does.
func TestShowPastRetention(t *testing.T) {
	t.Parallel()
	api := newAPIServer(t, "X-Api-Token", "secret")
	path, j := openTestJournal(t)
	hourAgo := time.Now().Add(-time.Hour)
	overdue := put(t, j, op{id: "old/1", url: api.URL + "/orders", body: []byte(`{}`), lastError: "sent, then: EOF",
		path: []idem.State{idem.StateInFlight, idem.StateUnknown}, expiresAt: hourAgo})
	fresh := put(t, j, op{id: "new/1", body: []byte(`{}`), path: []idem.State{idem.StateInFlight, idem.StateUnknown}})
	settled := put(t, j, op{id: "old/2", body: []byte(`{}`), path: []idem.State{idem.StateInFlight, idem.StateSucceeded},
		resp: &idem.Response{StatusCode: 201}, expiresAt: hourAgo})
	require.NoError(t, j.Close())

	r := idemOn(t, path, "show", overdue.Key)
	requireOK(t, r)
	assert.Regexp(t, `(?m)^expires       \S+ \S+ \(1h00m ago\): past the server's retention: Resume marks it expired without sending$`, r.stdout)
	for _, key := range []string{fresh.Key, settled.Key} {
		r = idemOn(t, path, "show", key)
		requireOK(t, r)
		assert.NotContains(t, r.stdout, "retention")
	}

	r = idemOn(t, path, "show", overdue.Key, "--json")
	requireOK(t, r)
	assert.Contains(t, r.stdout, `"past_retention":true`)
	r = idemOn(t, path, "show", settled.Key, "--json")
	requireOK(t, r)
	assert.NotContains(t, r.stdout, `"past_retention"`)

	r = idemOn(t, path, "ls")
	requireOK(t, r)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	require.Len(t, lines, 5, r.stdout)
	assert.Contains(t, strings.Fields(rowOf(t, lines, overdue.Key)), "unknown*")
	assert.Contains(t, strings.Fields(rowOf(t, lines, fresh.Key)), "unknown")
	assert.Contains(t, strings.Fields(rowOf(t, lines, settled.Key)), "succeeded")
	assert.Equal(t, "* past the server's retention: Resume marks it expired without sending (1 operation(s))", lines[4])

	r = idemOn(t, path, "ls", "--json")
	requireOK(t, r)
	for _, o := range jsonLines(t, r.stdout) {
		assert.Equal(t, o["key"] == overdue.Key, o["past_retention"] == true, o["id"])
	}

	// And so resume does, without a request.
	r = cli(t, "", []string{"IDEM_TEST_TOKEN=secret"}, "--journal", path, "resume", "--replay", "--base-url", api.URL,
		"--header-env", "X-Api-Token=IDEM_TEST_TOKEN")
	require.Equal(t, 3, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	assert.Equal(t, map[string]int{"claimed": 1, "expired": 1}, nonZero(summary(t, r.stdout)))
	assert.Equal(t, idem.StateExpired, getRecord(t, path, overdue.Key).State)
	api.mu.Lock()
	assert.Zero(t, api.authorized+api.unauthorized, "nothing was sent")
	api.mu.Unlock()
}

// A record of a schema-1 journal (testdata/journal-v1.db, written by the
// code before the key's form was journaled), once migrated, says that its
// form is not known.
func TestShowUnjournaledKeyForm(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "journal-v1.db"))
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "ops.db")
	require.NoError(t, os.WriteFile(path, b, 0o600))
	// show only reads: an older journal is migrated first, on purpose.
	requireOK(t, idemOn(t, path, "migrate"))

	r := idemOn(t, path, "show", "default/unknown")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "key header    not journaled (sent in the resuming client's form)\n")
	assert.Regexp(t, `(?m)^  1 +\S+ \S+ +create +→ in_flight `, r.stdout)

	r = idemOn(t, path, "show", "default/unknown", "--json")
	requireOK(t, r)
	var got jsonRecord
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	assert.Equal(t, &jsonKeyForm{}, got.KeyForm)
	assert.Contains(t, r.stdout, `"key_form":{"journaled":false,"quoted":false}`)
}
