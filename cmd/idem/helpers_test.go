package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem"
)

// idemBin is the idem binary built once by TestMain; every test runs it as
// a child process, as an operator would.
var idemBin string

// raceEnabled is set by race_test.go when the tests run with -race; the
// binary is then built with -race too.
var raceEnabled bool

func TestMain(m *testing.M) {
	if name := os.Getenv(appEnv); name != "" {
		// A child process started by startApp: it plays an application.
		os.Exit(runApp(name))
	}
	dir, err := os.MkdirTemp("", "idem-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	idemBin = filepath.Join(dir, "idem")
	args := []string{"build", "-o", idemBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the idem binary:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if pgPool != nil {
		pgPool.Close() // the PostgreSQL tests' shared pool
	}
	// The in-process tests open journals and clients: their Close must
	// have stopped every goroutine they started.
	if err := goleak.Find(); code == 0 && err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		code = 1
	}
	os.Exit(code)
}

// result is what one run of the binary produced.
type result struct {
	stdout, stderr string
	code           int
}

// cli runs the binary with args in dir (a fresh temporary directory when
// empty), with the test's environment minus IDEM_JOURNAL, plus env.
func cli(t *testing.T, dir string, env []string, args ...string) result {
	t.Helper()
	return runBinary(t, idemBin, dir, env, args...)
}

// runBinary runs an idem binary, as cli runs the one TestMain built.
func runBinary(t *testing.T, bin, dir string, env []string, args ...string) result {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(childEnv(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("running idem %v: %v", args, err)
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
}

// childEnv is the environment of the binary: the test's, without
// IDEM_JOURNAL, and without the race detector's one-second pause at exit.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_JOURNAL=") && !strings.HasPrefix(kv, "GORACE=") {
			env = append(env, kv)
		}
	}
	return append(env, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
}

// idemOn runs the binary on the journal at path.
func idemOn(t *testing.T, path string, args ...string) result {
	t.Helper()
	return cli(t, "", nil, append([]string{"--journal", path}, args...)...)
}

// requireOK checks a run that must succeed quietly on stderr.
func requireOK(t *testing.T, r result) {
	t.Helper()
	require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	require.Empty(t, r.stderr)
}

// requireOneLineError checks a failed run: the exit status, nothing on
// stdout, and exactly one line on stderr, prefixed "idem: ", containing
// want.
func requireOneLineError(t *testing.T, r result, code int, want string) {
	t.Helper()
	require.Equal(t, code, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	require.Empty(t, r.stdout)
	require.True(t, strings.HasSuffix(r.stderr, "\n"), "stderr %q", r.stderr)
	line := strings.TrimSuffix(r.stderr, "\n")
	require.NotContains(t, line, "\n", "stderr must be one line")
	require.True(t, strings.HasPrefix(line, "idem: "), "stderr %q", line)
	require.False(t, strings.HasPrefix(line, "idem: idem"), "stderr %q", line)
	require.Contains(t, line, want)
}

// jsonLines parses JSON-lines output.
func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var objs []map[string]any
	for line := range strings.Lines(out) {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "line %q", line)
		objs = append(objs, m)
	}
	return objs
}

// keysOf returns the "key" of each JSON object.
func keysOf(objs []map[string]any) []string {
	var keys []string
	for _, o := range objs {
		k, _ := o["key"].(string)
		keys = append(keys, k)
	}
	return keys
}

// newKey returns a random UUID-shaped key.
func newKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// openTestJournal creates a journal in a fresh directory.
func openTestJournal(t *testing.T) (string, *idem.SQLiteJournal) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ops.db")
	j, err := idem.OpenSQLite(path)
	require.NoError(t, err)
	return path, j
}

// op describes a record to journal and the states to move it through.
type op struct {
	// name is the record's name in the standard journal, if it is one.
	name           string
	key, scope, id string
	method, url    string
	header         http.Header
	body           []byte
	// path is the states, the first being pending or in_flight.
	path []idem.State
	// lastError is set with the last move; resp with the move to
	// succeeded or rejected.
	lastError string
	resp      *idem.Response
	// why is the event of the last move; expiresAt, when set, is the
	// record's ExpiresAt after it; due is its NextAttemptAt, at its
	// creation and after the last move.
	why       idem.Event
	expiresAt time.Time
	due       time.Time
}

// put journals o with Journal.Create and moves it along o.path with
// Journal.Update, as the client would.
func put(t *testing.T, j idem.Journal, o op) idem.Record {
	t.Helper()
	ctx := context.Background()
	if o.key == "" {
		o.key = newKey()
	}
	if o.scope == "" {
		o.scope = "default"
	}
	if o.method == "" {
		o.method = http.MethodPost
	}
	if o.url == "" {
		o.url = "https://api.example.com/orders"
	}
	if len(o.path) == 0 {
		o.path = []idem.State{idem.StatePending}
	}
	rec := idem.Record{Key: o.key, Scope: o.scope, ID: o.id, Method: o.method, URL: o.url, Header: o.header, Body: o.body,
		Fingerprint: idem.Fingerprint(o.method, o.url, o.header, nil, o.body), KeyHeader: "Idempotency-Key", State: o.path[0],
		NextAttemptAt: o.due}
	if rec.State == idem.StateInFlight {
		rec.Attempts = 1
		rec.ExpiresAt = time.Now().Add(24 * time.Hour)
	}
	rec, created, err := j.Create(ctx, rec)
	require.NoError(t, err)
	require.True(t, created)
	for i, st := range o.path[1:] {
		next := rec
		next.State = st
		if st == idem.StateInFlight {
			next.Attempts++
			next.ExpiresAt = time.Now().Add(24 * time.Hour)
		}
		why := idem.Event{}
		if i == len(o.path)-2 {
			next.LastError = o.lastError
			if st == idem.StateSucceeded || st == idem.StateRejected {
				next.Response = o.resp
			}
			if !o.expiresAt.IsZero() {
				next.ExpiresAt = o.expiresAt
			}
			next.NextAttemptAt = o.due
			why = o.why
		}
		rec, err = j.Update(ctx, next, idem.Durable, why)
		require.NoError(t, err)
	}
	return rec
}

// Names of the records of the standard journal.
const (
	rPending   = "pending"
	rInFlight  = "in_flight"
	rUnknown   = "unknown"
	rSucceeded = "succeeded"
	rRejected  = "rejected"
	rExpired   = "expired"
	rCanceled  = "canceled"
	rBinary    = "binary"
)

const (
	longID    = "batch/2025-11-29/nightly-settlement/merchant-000042/invoice-000000007/line-item-0003"
	longError = "sent, then: read tcp 127.0.0.1:51234->127.0.0.1:8443: read: connection reset by peer; " +
		"the server may have applied the request; a status check will tell; this message goes on and on to be cut in a table"
	pendingBody  = `{"cart":42,"items":["book","lamp"]}`
	responseBody = `{"order":"9812","status":"confirmed"}`
)

var binaryBody = []byte{0xff, 0xfe, 0x00, 0x01, 0x80, 'x'}

// standardJournal journals one operation in each state, in two scopes,
// and closes the journal.
func standardJournal(t *testing.T) (string, map[string]idem.Record) {
	t.Helper()
	path, j := openTestJournal(t)
	defer j.Close()
	return path, standardRecords(t, j, nil)
}

// standardRecords journals the standard journal's operations in j, with
// the keys of keys (by their names above) or random ones.
func standardRecords(t *testing.T, j idem.Journal, keys map[string]string) map[string]idem.Record {
	t.Helper()
	jsonHeader := http.Header{"Content-Type": {"application/json"}}
	put := func(t *testing.T, j idem.Journal, o op) idem.Record {
		t.Helper()
		if keys != nil {
			o.key = keys[o.name]
		}
		return put(t, j, o)
	}
	recs := map[string]idem.Record{
		rPending: put(t, j, op{name: rPending, id: "checkout/cart-42", header: jsonHeader, body: []byte(pendingBody)}),
		rInFlight: put(t, j, op{name: rInFlight, id: "pay/invoice-7", body: []byte(`{"invoice":7}`),
			path: []idem.State{idem.StateInFlight}}),
		rUnknown: put(t, j, op{name: rUnknown, id: longID, body: []byte(`{}`), lastError: longError,
			path: []idem.State{idem.StateInFlight, idem.StateUnknown}}),
		rSucceeded: put(t, j, op{name: rSucceeded, id: "checkout/cart-41", header: jsonHeader, body: []byte(`{"cart":41}`),
			path: []idem.State{idem.StateInFlight, idem.StateSucceeded},
			resp: &idem.Response{StatusCode: 201, Replayed: true, Body: []byte(responseBody),
				Header: http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"req-abc"}}}}),
		rRejected: put(t, j, op{name: rRejected, scope: "tenant-b", id: "refund/r-1", body: []byte(`{"refund":1}`),
			path: []idem.State{idem.StateInFlight, idem.StateRejected},
			resp: &idem.Response{StatusCode: 400, Body: []byte(`{"error":"out of stock"}`)}}),
		rExpired: put(t, j, op{name: rExpired, scope: "tenant-b", id: "ship/s-9", body: []byte(`{"ship":9}`),
			lastError: "the server's key retention (24h0m0s) ended before the outcome was confirmed; not re-sent",
			path:      []idem.State{idem.StateInFlight, idem.StateUnknown, idem.StateExpired}}),
		rCanceled: put(t, j, op{name: rCanceled, id: "checkout/cart-40", body: []byte(`{"cart":40}`), lastError: "canceled",
			path: []idem.State{idem.StatePending, idem.StateCanceled}}),
		rBinary: put(t, j, op{name: rBinary, scope: "tenant-b", id: "upload/u-1", body: binaryBody,
			path: []idem.State{idem.StateInFlight, idem.StateSucceeded},
			resp: &idem.Response{StatusCode: 200, Body: binaryBody}}),
	}
	return recs
}

// snapshot is everything a journal holds.
type snapshot struct {
	Records []idem.Record
	History map[string][]idem.Event
	Counts  []idem.Count
}

func takeSnapshot(t *testing.T, path string) snapshot {
	t.Helper()
	j, err := idem.OpenSQLite(path, idem.SQLiteMustExist())
	require.NoError(t, err)
	defer j.Close()
	return snapshotOf(t, j)
}

// snapshotOf reads everything j holds: its records, their histories and
// its counts.
func snapshotOf(t *testing.T, j idem.Journal) snapshot {
	t.Helper()
	ctx := context.Background()
	s := snapshot{History: map[string][]idem.Event{}}
	for rec, err := range j.List(ctx, idem.Filter{}) {
		require.NoError(t, err)
		s.Records = append(s.Records, rec)
		s.History[rec.Key], err = j.History(ctx, rec.Key)
		require.NoError(t, err)
	}
	var err error
	s.Counts, err = j.Count(ctx)
	require.NoError(t, err)
	return s
}

// getRecord reads one record back.
func getRecord(t *testing.T, path, key string) idem.Record {
	t.Helper()
	j, err := idem.OpenSQLite(path, idem.SQLiteMustExist())
	require.NoError(t, err)
	defer j.Close()
	rec, err := j.Get(context.Background(), key)
	require.NoError(t, err)
	return rec
}

// waitPastMillis waits until the clock is past t at the journal's
// millisecond precision, so that "older than 0s" includes t.
func waitPastMillis(t time.Time) {
	for time.Now().UnixMilli() <= t.UnixMilli() {
		time.Sleep(time.Millisecond)
	}
}

// latestUpdate is the latest UpdatedAt among recs.
func latestUpdate(recs map[string]idem.Record) time.Time {
	var last time.Time
	for _, r := range recs {
		if r.UpdatedAt.After(last) {
			last = r.UpdatedAt
		}
	}
	return last
}
