package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
)

// storyServer fails the way TestShowTellsTheStory needs, one request at a
// time: the first POST gets a 503; the second, on the connection the first
// left open, is applied and then its connection dropped, so Go's transport
// sends it again by itself on a new connection, which is dropped too. The
// first status check answers in a shape that is not idem's; the second
// hangs until the test lets it go; the later ones answer with the stored
// result.
type storyServer struct {
	*httptest.Server
	check2  chan struct{} // closed when the second status check arrives
	release chan struct{} // closed by the test: the hanging check ends

	mu            sync.Mutex
	posts, checks int
	executed      int
	stored        []byte
	keysSeen      []string
}

func newStoryServer(t *testing.T) *storyServer {
	s := &storyServer{check2: make(chan struct{}), release: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		s.letGo()
		s.Close()
	})
	return s
}

func (s *storyServer) letGo() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.release:
	default:
		close(s.release)
	}
}

func (s *storyServer) serve(w http.ResponseWriter, r *http.Request) {
	if key, ok := strings.CutPrefix(r.URL.Path, "/status/"); ok {
		s.status(w, r, key)
		return
	}
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.posts++
	n := s.posts
	s.keysSeen = append(s.keysSeen, r.Header.Get("Idempotency-Key"))
	if n == 2 {
		s.executed++
		s.stored = append([]byte(`{"order":"o-1","request":`), append(body, '}')...)
	}
	s.mu.Unlock()
	if n == 1 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":"busy"}`))
		return
	}
	drop(w)
}

func (s *storyServer) status(w http.ResponseWriter, r *http.Request, key string) {
	s.mu.Lock()
	s.checks++
	n := s.checks
	stored := s.stored
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch n {
	case 1:
		_, _ = w.Write([]byte(`{"status":"done"}`))
	case 2:
		close(s.check2)
		select {
		case <-s.release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	default:
		_ = json.NewEncoder(w).Encode(wire.Status{Key: key, State: wire.StateCompleted,
			Response: wire.NewResponse(http.StatusCreated, http.Header{"Content-Type": {"application/json"}}, stored)})
	}
}

// drop closes the connection without an answer.
func drop(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

// The history of an operation tells its story, as the real client wrote
// it: a 503 and a retry with the same key, a dropped connection that the
// transport re-sent on its own, a status check that failed and why, the
// process killed while holding the lease, "idem resume" taking it over at
// once because its owner is gone, and the status check that settled it.
func TestShowTellsTheStory(t *testing.T) {
	t.Parallel()
	srv, path, rec := killedHoldingTheLease(t)

	// What an operator sees now: the operation is unknown, leased by a
	// process that is gone, and the last error is the status check's.
	r := idemOn(t, path, "show", rec.Key)
	requireOK(t, r)
	t.Logf("idem show, after the kill:\n%s", r.stdout)
	assert.Contains(t, r.stdout, "key header    Idempotency-Key: "+rec.Key+" (bare token)\n")
	assert.Contains(t, r.stdout, "state         unknown\n")
	assert.Regexp(t, `(?m)^attempts      2, and 1 re-send\(s\) by Go's HTTP transport on its own \(a reused connection died before any reply; each may have reached the server\)$`, r.stdout)
	assert.Regexp(t, `(?m)^last error    status check by status endpoint `+regexp.QuoteMeta(srv.URL)+`/status: .*status.*$`, r.stdout)
	assert.Regexp(t, `(?m)^lease         pod-1#[0-9a-f]{8}, epoch 1, until `, r.stdout)

	r = cli(t, "", nil, "--journal", path, "resume", "--base-url", srv.URL, "--status-url", srv.URL+"/status")
	require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	assert.Equal(t, map[string]int{"claimed": 1, "succeeded": 1}, nonZero(summary(t, r.stdout)))

	r = idemOn(t, path, "show", rec.Key)
	requireOK(t, r)
	t.Logf("idem show, after idem resume:\n%s", r.stdout)
	assert.Contains(t, r.stdout, "state         succeeded\n")
	assert.Contains(t, r.stdout, "response: 201 Created (replayed by the server)\n")
	hist := r.stdout[strings.Index(r.stdout, "\nhistory:\n"):]
	const at = `\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z +`
	for _, line := range []string{
		`  VERSION +AT +KIND +CHANGE +ATTEMPT +STATUS +OWNER +WHY`,
		`  1 +` + at + `create +→ in_flight +1 +- +pod-1#[0-9a-f]{8} +-`,
		`  2 +` + at + `send += +2 +- +pod-1#[0-9a-f]{8} +retry, same key: HTTP 503; waited \d+m?s \(backoff\)`,
		`  3 +` + at + `answer +in_flight → unknown +2 +- +pod-1#[0-9a-f]{8} +sent, then: .*EOF.*`,
		`  4 +` + at + `status += +2 +- +pod-1#[0-9a-f]{8} +check 1: failed: .*status.*`,
		`  5 +` + at + `claim += +2 +- +idem-resume/\S+ +taken over from pod-1#[0-9a-f]{8}: its owner is gone`,
		`  6 +` + at + `status +unknown → succeeded +2 +201 +idem-resume/\S+ +check 1: completed, HTTP 201`,
	} {
		assert.Regexp(t, `(?m)^`+line+`$`, hist)
	}
	assert.Len(t, strings.Split(strings.TrimSpace(hist), "\n"), 8, "a title, a header and six events:\n%s", hist)
	// A failed check's detail says what failed; the record's error, which
	// names the checker too, is not repeated.
	assert.Equal(t, 1, strings.Count(hist, `without a "state" field`), hist)
	assert.Regexp(t, `(?m)^  3 .*the transport sent it again 1 time\(s\) by itself`, hist, "the re-send is told where it happened")

	// The JSON has every event's kind and detail, and the key's form.
	r = idemOn(t, path, "show", rec.Key, "--json")
	requireOK(t, r)
	var got jsonRecord
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	assert.Equal(t, &jsonKeyForm{Journaled: true, Header: "Idempotency-Key", Value: rec.Key}, got.KeyForm)
	assert.Equal(t, 1, got.TransportResends)
	var kinds []string
	for _, ev := range got.History {
		kinds = append(kinds, ev.Kind)
	}
	assert.Equal(t, []string{"create", "send", "answer", "status", "claim", "status"}, kinds)
	assert.Regexp(t, `^retry, same key: HTTP 503; waited `, got.History[1].Detail)
	assert.Regexp(t, `^check 1: failed: `, got.History[3].Detail)
	assert.Regexp(t, `^taken over from pod-1#[0-9a-f]{8}: its owner is gone$`, got.History[4].Detail)

	// The server ran the order once; every request carried the one key.
	srv.mu.Lock()
	defer srv.mu.Unlock()
	assert.Equal(t, 1, srv.executed)
	assert.Equal(t, 3, srv.posts, "two attempts and the transport's own re-send")
	for _, k := range srv.keysSeen {
		assert.Equal(t, rec.Key, k)
	}
}

// killedHoldingTheLease runs the story application until its second
// status check and kills it there: it dies holding the operation's
// lease, which has not expired, and its owner is gone.
func killedHoldingTheLease(t *testing.T) (*storyServer, string, idem.Record) {
	t.Helper()
	srv, path, rec, app, exited := holdingTheLease(t)
	require.NoError(t, app.Process.Kill())
	<-exited
	srv.letGo()
	return srv, path, rec
}

// holdingTheLease runs the story application until its second status
// check, which hangs until srv.letGo: the application is alive, holding
// the unknown operation's lease for an hour. exited is closed when it
// has ended.
func holdingTheLease(t *testing.T) (*storyServer, string, idem.Record, *exec.Cmd, <-chan struct{}) {
	t.Helper()
	return holdingTheLeaseFor(t, "1h")
}

// holdingTheLeaseFor is holdingTheLease with a lease of the duration
// given (which the application renews while it runs).
func holdingTheLeaseFor(t *testing.T, lease string) (*storyServer, string, idem.Record, *exec.Cmd, <-chan struct{}) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ops.db")
	var j idem.Journal
	t.Cleanup(func() {
		if j != nil {
			_ = j.Close()
		}
	})
	srv, rec, app, exited := storyHolding(t, func() idem.Journal {
		if j == nil {
			var err error
			j, err = idem.OpenSQLite(path, idem.SQLiteMustExist())
			require.NoError(t, err)
		}
		return j
	}, "IDEM_TEST_JOURNAL="+path, "IDEM_TEST_LEASE="+lease)
	require.NoError(t, j.Close())
	j = nil
	return srv, path, rec, app, exited
}

// storyHolding runs the story application with env (which names its
// journal) until its second status check, which hangs until srv.letGo,
// and returns the operation as journal (the test's handle on the same
// journal, opened once the application has created it) reads it then.
func storyHolding(t *testing.T, journal func() idem.Journal, env ...string) (*storyServer, idem.Record, *exec.Cmd, <-chan struct{}) {
	t.Helper()
	srv := newStoryServer(t)
	app, out := startApp(t, "story", append([]string{"IDEM_TEST_BASE_URL=" + srv.URL}, env...)...)

	// The application is in its second status check, which hangs: wait
	// until the first is journaled. exited is closed when it has ended;
	// a test that fails before then kills it (this cleanup runs before
	// startApp's, which reads what Wait wrote).
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = app.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = app.Process.Signal(syscall.SIGCONT)
		_ = app.Process.Kill()
		<-exited
	})
	select {
	case <-srv.check2:
	case <-exited:
		t.Fatalf("the application exited early (%v):\n%s", waitErr, out)
	}
	j := journal()
	var rec idem.Record
	for {
		var err error
		rec, err = j.Lookup(context.Background(), "default", "checkout/cart-42")
		require.NoError(t, err)
		hist, err := j.History(context.Background(), rec.Key)
		require.NoError(t, err)
		if hist[len(hist)-1].Kind == idem.EventStatus {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return srv, rec, app, exited
}

// A reconcile does not wait for the lease of a process that died holding
// it: the journal sees its owner gone (its lock file is free), as idem
// resume's claim does.
func TestReconcileOfAKilledProcessOperation(t *testing.T) {
	t.Parallel()
	_, path, rec := killedHoldingTheLease(t)
	require.True(t, getRecord(t, path, rec.Key).Lease.Held(time.Now()), "the lease has not lapsed")
	r := idemOn(t, path, "reconcile", rec.Key, "--as", "succeeded", "--note", "order 42 is in the ERP")
	requireOK(t, r)
	assert.Equal(t, "reconciled "+rec.Key+" (default/checkout/cart-42) as succeeded, was unknown\n", r.stdout)
	assert.Equal(t, idem.StateSucceeded, getRecord(t, path, rec.Key).State)
}
