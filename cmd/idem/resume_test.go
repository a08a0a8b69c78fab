package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
)

// apiServer is an API on loopback that honours idempotency keys: it
// executes each key once, replays the stored answer for the key after
// that, and serves the status endpoint GET /idempotency/{key}. Every
// request must carry the credential header.
type apiServer struct {
	*httptest.Server
	authHeader, secret string

	mu sync.Mutex
	// before, when set, sees each request first, without holding mu.
	before                                 func(*http.Request)
	stored                                 map[string]storedAnswer
	executed                               map[string]int // times each key was executed
	authorized, unauthorized, statusChecks int
}

type storedAnswer struct {
	status int
	header http.Header
	body   []byte
}

func newAPIServer(t *testing.T, authHeader, secret string) *apiServer {
	s := &apiServer{authHeader: authHeader, secret: secret, stored: map[string]storedAnswer{}, executed: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *apiServer) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	before := s.before
	s.mu.Unlock()
	if before != nil {
		before(r)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Header.Get(s.authHeader) != s.secret {
		s.unauthorized++
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	s.authorized++
	w.Header().Set("Content-Type", "application/json")
	if key, ok := strings.CutPrefix(r.URL.Path, "/idempotency/"); ok && r.Method == http.MethodGet {
		s.statusChecks++
		a, found := s.stored[key]
		if !found {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(wire.Status{Key: key, State: wire.StateNotFound})
			return
		}
		_ = json.NewEncoder(w).Encode(wire.Status{Key: key, State: wire.StateCompleted,
			Response: wire.NewResponse(a.status, a.header, a.body)})
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		http.Error(w, "Idempotency-Key required", http.StatusBadRequest)
		return
	}
	if a, found := s.stored[key]; found {
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(a.status)
		_, _ = w.Write(a.body)
		return
	}
	body, _ := io.ReadAll(r.Body)
	s.executed[key]++
	a := storedAnswer{status: http.StatusCreated, header: http.Header{"Content-Type": {"application/json"}},
		body: fmt.Appendf(nil, `{"order":%q,"request":%s}`, key, body)}
	if r.URL.Path == "/reject" {
		a.status, a.body = http.StatusBadRequest, []byte(`{"error":"out of stock"}`)
	}
	s.stored[key] = a
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}

func (s *apiServer) store(key string, a storedAnswer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stored[key] = a
}

func (s *apiServer) counts(key string) (executed int, stored bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, stored = s.stored[key]
	return s.executed[key], stored
}

var summaryRE = regexp.MustCompile(`(?m)^resume: claimed (\d+), succeeded (\d+), rejected (\d+), pending (\d+), unknown (\d+), expired (\d+), skipped (\d+), failed (\d+); ` +
	`left alone: busy (\d+), leased by a live owner (\d+), not due (\d+)( \(the next due at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z, in \S+\))?$`)

// summary parses resume's summary line: the counts, by name. Skipped is
// the sum of what was left alone, and the next due time is given when
// something is not due.
func summary(t *testing.T, stdout string) map[string]int {
	t.Helper()
	m := summaryRE.FindStringSubmatch(stdout)
	require.NotNil(t, m, "no summary in %q", stdout)
	out := map[string]int{}
	for i, name := range []string{"claimed", "succeeded", "rejected", "pending", "unknown", "expired", "skipped", "failed",
		"busy", "leased", "not_due"} {
		out[name], _ = strconv.Atoi(m[i+1])
	}
	require.Equal(t, out["skipped"], out["busy"]+out["leased"]+out["not_due"], m[0])
	require.Equal(t, out["not_due"] > 0, m[12] != "", "the next due time is given when something is not due: %s", m[0])
	return out
}

func TestResumeSettlesEverything(t *testing.T) {
	t.Parallel()
	secret := "sk_test_" + newKey()
	api := newAPIServer(t, "X-Api-Token", secret)
	path, j := openTestJournal(t)
	jsonHeader := http.Header{"Content-Type": {"application/json"}}
	// Never sent: sent now.
	pending := put(t, j, op{id: "checkout/cart-1", url: api.URL + "/orders", header: jsonHeader, body: []byte(`{"cart":1}`)})
	// Sent, the answer lost: the server has it, so a status check settles
	// it without executing it again.
	applied := put(t, j, op{id: "checkout/cart-2", url: api.URL + "/orders", body: []byte(`{"cart":2}`),
		lastError: "sent, then: EOF", path: []idem.State{idem.StateInFlight, idem.StateUnknown}})
	api.store(applied.Key, storedAnswer{status: 201, header: jsonHeader, body: []byte(`{"order":"from before the crash"}`)})
	// Crashed while in flight, before the server saw it: the status check
	// says not_found, and it is re-sent with the same key.
	crashed := put(t, j, op{id: "checkout/cart-3", url: api.URL + "/orders", body: []byte(`{"cart":3}`),
		path: []idem.State{idem.StateInFlight}})
	// Refused by the server: rejected.
	refused := put(t, j, op{id: "checkout/cart-4", url: api.URL + "/reject", body: []byte(`{"cart":4}`)})
	// Settled and expired operations are not resumed.
	done := put(t, j, op{id: "checkout/cart-0", url: api.URL + "/orders",
		path: []idem.State{idem.StateInFlight, idem.StateSucceeded}, resp: &idem.Response{StatusCode: 201}})
	expired := put(t, j, op{id: "checkout/cart-x", url: api.URL + "/orders",
		path: []idem.State{idem.StateInFlight, idem.StateUnknown, idem.StateExpired}})
	require.NoError(t, j.Close())

	env := []string{"IDEM_TEST_API_TOKEN=" + secret}
	r := cli(t, "", env, "resume", "--journal", path, "--base-url", api.URL, "--status-url", api.URL+"/idempotency",
		"--header-env", "X-Api-Token=IDEM_TEST_API_TOKEN", "--concurrency", "2")
	require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	assert.Empty(t, r.stderr)
	assert.Equal(t, map[string]int{"claimed": 4, "succeeded": 3, "rejected": 1}, nonZero(summary(t, r.stdout)))
	// The expired operation still waits for an operator.
	assert.Contains(t, r.stdout, "\njournal: 1 operation(s) unsettled")
	// Not a terminal: no progress line.
	assert.NotContains(t, r.stdout, "\r")

	for _, tc := range []struct {
		rec      idem.Record
		state    idem.State
		status   int
		executed int
		replayed bool
	}{
		{pending, idem.StateSucceeded, 201, 1, false},
		{applied, idem.StateSucceeded, 201, 0, true},
		{crashed, idem.StateSucceeded, 201, 1, false},
		{refused, idem.StateRejected, 400, 1, false},
	} {
		rec := getRecord(t, path, tc.rec.Key)
		assert.Equal(t, tc.state, rec.State, tc.rec.ID)
		require.NotNil(t, rec.Response, tc.rec.ID)
		assert.Equal(t, tc.status, rec.Response.StatusCode, tc.rec.ID)
		assert.Equal(t, tc.replayed, rec.Response.Replayed, tc.rec.ID)
		executed, stored := api.counts(tc.rec.Key)
		assert.Equal(t, tc.executed, executed, "%s executed under its journaled key", tc.rec.ID)
		assert.True(t, stored, tc.rec.ID)
	}
	assert.Equal(t, `{"order":"from before the crash"}`, string(getRecord(t, path, applied.Key).Response.Body))
	assert.Equal(t, done, getRecord(t, path, done.Key))
	assert.Equal(t, expired, getRecord(t, path, expired.Key))

	// The credential came from the environment and reached the server on
	// every request and status check...
	api.mu.Lock()
	assert.Zero(t, api.unauthorized)
	// Three sends, two status checks and the re-send of the one not found.
	assert.Equal(t, 5, api.authorized)
	assert.Equal(t, 2, api.statusChecks)
	api.mu.Unlock()
	// ...and is nowhere in the journal's files, nor in the output.
	files, err := filepath.Glob(path + "*")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	owners, err := filepath.Glob(path + "-owners/*") // the lock files of live clients
	require.NoError(t, err)
	files = slices.DeleteFunc(append(files, owners...), func(f string) bool { return f == path+"-owners" })
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		assert.False(t, bytes.Contains(b, []byte(secret)), "the secret is in %s", f)
		assert.False(t, bytes.Contains(b, []byte("sk_test_")), "the secret is in %s", f)
	}
	assert.NotContains(t, r.stdout+r.stderr, secret)

	// Nothing is left to resume.
	r = cli(t, "", env, "resume", "--journal", path, "--base-url", api.URL, "--status-url", api.URL+"/idempotency",
		"--header-env", "X-Api-Token=IDEM_TEST_API_TOKEN")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Empty(t, nonZero(summary(t, r.stdout)))
}

// nonZero drops the zero counts.
func nonZero(m map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

func TestResumeServerDown(t *testing.T) {
	t.Parallel()
	api := newAPIServer(t, "X-Api-Token", "secret")
	down := api.URL
	api.Close() // nothing listens there any more
	path, j := openTestJournal(t)
	pending := put(t, j, op{id: "a", url: down + "/orders", body: []byte(`{"a":1}`)})
	unknown := put(t, j, op{id: "b", url: down + "/orders", body: []byte(`{"b":1}`),
		path: []idem.State{idem.StateInFlight, idem.StateUnknown}})
	require.NoError(t, j.Close())

	// The status checks of the unknown operation would go on for a while:
	// --timeout stops the run; every operation stays journaled.
	r := cli(t, "", []string{"IDEM_TEST_API_TOKEN=secret"}, "--journal", path, "resume", "--base-url", down,
		"--status-url", down+"/idempotency", "--header-env", "X-Api-Token=IDEM_TEST_API_TOKEN", "--timeout", "2s")
	require.Equal(t, 3, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	assert.Equal(t, map[string]int{"claimed": 2, "pending": 1, "unknown": 1}, nonZero(summary(t, r.stdout)))
	assert.Contains(t, r.stdout, "\njournal: 2 operation(s) unsettled")
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	require.Len(t, lines, 1, r.stderr)
	assert.Regexp(t, `^idem: (2 operation\(s\) remain unsettled \(pending 1, unknown 1, expired 0, failed 0\)|resume stopped by --timeout)`, lines[0])

	// The same operations, with the same keys, wait for the next run.
	p := getRecord(t, path, pending.Key)
	assert.Equal(t, idem.StatePending, p.State)
	assert.NotEmpty(t, p.LastError)
	assert.Equal(t, idem.StateUnknown, getRecord(t, path, unknown.Key).State)
	snap := takeSnapshot(t, path)
	assert.Len(t, snap.Records, 2)
}

func TestResumeKeepsCredentialsAtHome(t *testing.T) {
	t.Parallel()
	secret := "sk_test_" + newKey()
	api := newAPIServer(t, "Authorization", "Bearer "+secret)
	// Another API, which must never see the credential.
	var elsewhere sync.Mutex
	var leaked []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Lock()
		leaked = append(leaked, r.Header.Get("Authorization"))
		elsewhere.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer other.Close()

	path, j := openTestJournal(t)
	home := put(t, j, op{id: "home", url: api.URL + "/orders", body: []byte(`{}`)})
	away := put(t, j, op{id: "away", url: other.URL + "/orders", body: []byte(`{}`)})
	require.NoError(t, j.Close())

	r := cli(t, "", []string{"IDEM_TEST_BEARER=Bearer " + secret}, "--journal", path, "resume", "--base-url", api.URL,
		"--status-url", api.URL+"/idempotency", "--header-env", "Authorization=IDEM_TEST_BEARER")
	// Resume claims only the operations under --base-url's origin: the
	// other one is neither claimed nor touched.
	require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	assert.Equal(t, map[string]int{"claimed": 1, "succeeded": 1}, nonZero(summary(t, r.stdout)))
	assert.Contains(t, r.stderr, "idem: warning: 1 unsettled operation(s) target other origins than --base-url, such as http://127.0.0.1:")

	assert.Equal(t, idem.StateSucceeded, getRecord(t, path, home.Key).State)
	rec := getRecord(t, path, away.Key)
	assert.Equal(t, idem.StatePending, rec.State)
	assert.Zero(t, rec.Attempts, "never attempted")
	assert.Empty(t, rec.Lease.Owner, "never claimed")
	elsewhere.Lock()
	assert.Empty(t, leaked, "nothing was sent to the other origin")
	elsewhere.Unlock()
}

// The progress line, as a terminal gets it: rewritten in place, then
// erased before the summary.
func TestProgressLine(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	p := &progressLine{w: &b}
	p.clear() // nothing shown yet: nothing to erase
	assert.Empty(t, b.String())
	p.update(idem.ResumeReport{Claimed: 12, Succeeded: 9, Rejected: 1, Pending: 1})
	first := "resume: 11 of 12 claimed done: 9 succeeded, 1 rejected, 1 pending, 0 unknown, 0 expired, 0 failed"
	assert.Equal(t, "\r"+first, b.String())
	b.Reset()
	p.write("resume: short")
	assert.Equal(t, "\rresume: short"+strings.Repeat(" ", len(first)-len("resume: short")), b.String())
	b.Reset()
	p.clear()
	assert.Equal(t, "\r"+strings.Repeat(" ", len("resume: short"))+"\r", b.String())
}

func TestResumeReplay(t *testing.T) {
	t.Parallel()
	api := newAPIServer(t, "X-Api-Token", "replay-secret")
	path, j := openTestJournal(t)
	// Its answer was lost; the server replays it for the same key.
	lost := put(t, j, op{id: "lost", url: api.URL + "/orders", body: []byte(`{"n":1}`),
		path: []idem.State{idem.StateInFlight, idem.StateUnknown}})
	api.store(lost.Key, storedAnswer{status: 201, body: []byte(`{"order":"kept"}`)})
	require.NoError(t, j.Close())

	r := cli(t, "", []string{"IDEM_TEST_REPLAY_TOKEN=replay-secret"}, "--journal", path, "resume", "--replay",
		"--base-url", api.URL, "--header-env", "x-api-token=IDEM_TEST_REPLAY_TOKEN")
	require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	assert.Equal(t, map[string]int{"claimed": 1, "succeeded": 1}, nonZero(summary(t, r.stdout)))
	rec := getRecord(t, path, lost.Key)
	assert.Equal(t, idem.StateSucceeded, rec.State)
	assert.True(t, rec.Response.Replayed)
	assert.Equal(t, `{"order":"kept"}`, string(rec.Response.Body))
	executed, _ := api.counts(lost.Key)
	assert.Zero(t, executed, "replayed, not executed again")
	api.mu.Lock()
	assert.Zero(t, api.statusChecks)
	api.mu.Unlock()
}

// Ctrl-C stops resume cleanly: the operation stays journaled, unlocked
// for the next run.
func TestResumeInterrupted(t *testing.T) {
	t.Parallel()
	api := newAPIServer(t, "X-Api-Token", "secret")
	down := api.URL
	api.Close()
	path, j := openTestJournal(t)
	defer j.Close()
	rec := put(t, j, op{id: "stuck", url: down + "/orders", path: []idem.State{idem.StateInFlight, idem.StateUnknown}})

	cmd := exec.Command(idemBin, "--journal", path, "resume", "--base-url", down, "--status-url", down+"/idempotency")
	cmd.Env = childEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	// Once it holds the operation, it is checking its status, which goes
	// on with backoff while the server is down.
	for {
		cur, err := j.Get(context.Background(), rec.Key)
		require.NoError(t, err)
		if cur.Lease.Owner != "" {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	err := cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	assert.Equal(t, 3, exit.ExitCode())
	assert.Equal(t, "idem: resume stopped by a signal before it finished; unsettled operations stay journaled for the next run\n", stderr.String())
	assert.Equal(t, map[string]int{"claimed": 1, "unknown": 1}, nonZero(summary(t, stdout.String())))

	cur, err := j.Get(context.Background(), rec.Key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateUnknown, cur.State)
	assert.Empty(t, cur.Lease.Owner, "the lease is released")
	assert.Equal(t, rec.Key, cur.Key)
}
