package idem_test

// The promise in every configuration: tenants, the key's wire form, dead
// owners, 409/422, Retry-After, a clean exit, and answers that explain
// themselves. Each test here was first written against the code before it
// was fixed (branch repro-old), where it failed; the failure messages are
// the ones it would print again. Real SQLite journals, real loopback
// servers, real child processes killed with SIGKILL where a process dies.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/faultproxy"
	"github.com/idemkit/idem/internal/testserver"
)

// ---- helpers -------------------------------------------------------------

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// serveAt starts h on addr (127.0.0.1:port), closed at cleanup.
func serveAt(t *testing.T, addr string, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	_ = srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// hit is one request a repro server saw.
type hit struct {
	Method, Path, Auth, IdemKey, RequestKey string
}

// hitLog records the requests a server saw.
type hitLog struct {
	mu   sync.Mutex
	hits []hit
}

func (l *hitLog) add(r *http.Request) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hits = append(l.hits, hit{Method: r.Method, Path: r.URL.Path, Auth: r.Header.Get("Authorization"),
		IdemKey: r.Header.Get("Idempotency-Key"), RequestKey: r.Header.Get("X-Request-Key")})
	return len(l.hits)
}

func (l *hitLog) all() []hit {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]hit(nil), l.hits...)
}

func (l *hitLog) count(method string) int {
	n := 0
	for _, h := range l.all() {
		if h.Method == method {
			n++
		}
	}
	return n
}

// dropConn closes the connection without an answer.
func dropConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

func bearer(token string) func(*http.Request) error {
	return func(r *http.Request) error { r.Header.Set("Authorization", "Bearer "+token); return nil }
}

// ---- child processes -----------------------------------------------------

func init() {
	children["hold"] = childHold
	children["clean-exit"] = childCleanExit
}

// childHold runs one Do of IDEM_OP against IDEM_URL (a server that
// holds it) with Owner IDEM_OWNER and LeaseDuration IDEM_LEASE when set
// (defaults otherwise), after printing "started". The parent kills it.
func childHold() error {
	j, err := idem.OpenSQLite(os.Getenv("IDEM_JOURNAL"))
	if err != nil {
		return err
	}
	cfg := idem.Config{Journal: j, BaseURL: os.Getenv("IDEM_URL"), Owner: os.Getenv("IDEM_OWNER"),
		AttemptTimeout: time.Minute}
	if s := os.Getenv("IDEM_LEASE"); s != "" {
		if cfg.LeaseDuration, err = time.ParseDuration(s); err != nil {
			return err
		}
	}
	c, err := idem.New(cfg)
	if err != nil {
		return err
	}
	fmt.Println("started")
	_, err = c.Do(context.Background(), idem.Op{ID: os.Getenv("IDEM_OP"), URL: os.Getenv("IDEM_PATH"), Body: []byte(`{}`)})
	return fmt.Errorf("Do returned although the parent should have killed this process: %v", err)
}

// childCleanExit does what the README's snippet does: one Do that
// succeeds, Client.Close, and the process exits (os.Exit(0) in TestMain)
// without closing the journal.
func childCleanExit() error {
	j, err := idem.OpenSQLite(os.Getenv("IDEM_JOURNAL"))
	if err != nil {
		return err
	}
	c, err := idem.New(idem.Config{Journal: j, BaseURL: os.Getenv("IDEM_URL")})
	if err != nil {
		return err
	}
	res, err := c.Do(context.Background(), idem.Op{ID: os.Getenv("IDEM_OP"), URL: "/orders", Body: []byte(`{}`)})
	if err != nil {
		return err
	}
	if res.State != idem.StateSucceeded {
		return fmt.Errorf("Do: %s", res.State)
	}
	return c.Close()
}

// startHoldChild starts childHold and waits for "started".
func startHoldChild(t *testing.T, env ...string) *os.Process {
	t.Helper()
	cmd := childCommand(t, "hold", env...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	require.True(t, lines.Scan(), "the child starts")
	require.Equal(t, "started", lines.Text())
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return cmd.Process
}

// holdServer holds every POST to /hold while hold is set, answers 201
// otherwise, and signals each arrival.
type holdServer struct {
	*httptest.Server
	hold    atomic.Bool
	arrived chan string
	log     hitLog
}

func newHoldServer(t *testing.T) *holdServer {
	t.Helper()
	s := &holdServer{arrived: make(chan string, 100)}
	s.hold.Store(true)
	stop := make(chan struct{})
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.log.add(r)
		_, _ = io.Copy(io.Discard, r.Body)
		s.arrived <- r.URL.Path
		switch {
		case r.URL.Path == "/slow":
			select {
			case <-time.After(4 * time.Second):
			case <-stop:
			}
		case r.URL.Path == "/hold" && s.hold.Load():
			select {
			case <-r.Context().Done():
			case <-stop:
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(func() { close(stop); s.Server.Close() })
	return s
}

func (s *holdServer) waitArrival(t *testing.T, path string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case p := <-s.arrived:
			if p == path {
				return
			}
		case <-deadline:
			t.Fatalf("no request to %s arrived", path)
		}
	}
}

// tenant A's Resume must not claim tenant B's operation, nor send it
// with A's credentials.
func TestResumeStaysInItsTenant(t *testing.T) {
	t.Parallel()
	for _, sameAPI := range []bool{true, false} {
		name := "one API, two tenants, BaseURL set"
		if !sameAPI {
			name = "two APIs, no BaseURL"
		}
		for _, path := range []string{"Resume", "background resume"} {
			t.Run(name+", "+path, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
				var apiA, apiB hitLog
				handler := func(l *hitLog) http.Handler {
					return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						l.add(r)
						w.WriteHeader(http.StatusCreated)
					})
				}
				// B's API is down when B sends: B's operation stays pending.
				addrB := freeAddr(t)
				// Authorize sees which operation it authorizes.
				var seen sync.Map
				authorize := func(token string) func(*http.Request) error {
					return func(r *http.Request) error {
						op, ok := idem.OperationFrom(r.Context())
						if !ok {
							return fmt.Errorf("no operation in the request's context")
						}
						seen.Store(op.Scope+"/"+op.ID, true)
						r.Header.Set("Authorization", "Bearer "+token)
						return nil
					}
				}
				cfgA := idem.Config{Journal: j, Scope: "tenant-a", Authorize: authorize("token-a"), Retry: fastRetry()}
				cfgB := idem.Config{Journal: j, Scope: "tenant-b", Authorize: authorize("token-b"), Retry: fastRetry()}
				if sameAPI {
					// One API for both tenants, told apart by their tokens.
					cfgA.BaseURL, cfgB.BaseURL = "http://"+addrB, "http://"+addrB
				} else {
					// A's own API is up; A has nothing unfinished there.
					srvA := httptest.NewServer(handler(&apiA))
					t.Cleanup(srvA.Close)
				}
				if path == "background resume" {
					cfgA.ResumeInterval = 10 * time.Millisecond
				}
				b, _ := newClient(t, cfgB)
				_, err := b.Do(ctx, idem.Op{ID: "invoice-7", URL: "http://" + addrB + "/b/charges", Body: []byte(`{"amount":100}`)})
				require.ErrorIs(t, err, idem.ErrNotSent)
				_, ok := seen.Load("tenant-b/invoice-7")
				require.True(t, ok, "Authorize saw the operation it authorized")
				time.Sleep(50 * time.Millisecond) // past its backoff: due
				serveAt(t, addrB, handler(&apiB)) // B's API is back

				a, _ := newClient(t, cfgA)
				var rep idem.ResumeReport
				if path == "Resume" {
					rep, err = a.Resume(ctx)
					require.NoError(t, err)
				} else {
					time.Sleep(300 * time.Millisecond) // many background rounds
				}
				for _, h := range apiB.all() {
					assert.NotEqual(t, "Bearer token-a", h.Auth, "tenant B's operation (%s %s) was sent with tenant A's token", h.Method, h.Path)
				}
				assert.Zero(t, rep.Claimed, "tenant A's Resume claimed tenant B's operation: report %+v", rep)
				rec, err := j.Lookup(ctx, "tenant-b", "invoice-7")
				require.NoError(t, err)
				assert.Equal(t, idem.StatePending.String(), rec.State.String(), "tenant B's operation was settled by tenant A's Resume")

				// B's own Resume sends it, with B's token.
				rep, err = b.Resume(ctx)
				require.NoError(t, err)
				assert.Equal(t, 1, rep.Succeeded, "report %+v", rep)
				hits := apiB.all()
				require.Len(t, hits, 1)
				assert.Equal(t, "Bearer token-b", hits[0].Auth)
			})
		}
	}
	// An operator's client takes every scope only when told to.
	t.Run("ResumeAllScopes", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
		addr := freeAddr(t)
		for _, tenant := range []string{"tenant-a", "tenant-b"} {
			c, _ := newClient(t, idem.Config{Journal: j, Scope: tenant, BaseURL: "http://" + addr, Retry: fastRetry()})
			_, err := c.Do(ctx, idem.Op{ID: "op", URL: "/x"})
			require.ErrorIs(t, err, idem.ErrNotSent)
		}
		var api hitLog
		serveAt(t, addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { api.add(r); w.WriteHeader(201) }))
		time.Sleep(50 * time.Millisecond)
		op, _ := newClient(t, idem.Config{Journal: j, BaseURL: "http://" + addr, Retry: fastRetry()})
		rep, err := op.Resume(ctx)
		require.NoError(t, err)
		assert.Zero(t, rep.Claimed, "scope default has nothing")
		rep, err = op.Resume(ctx, idem.ResumeAllScopes())
		require.NoError(t, err)
		assert.Equal(t, 2, rep.Succeeded, "report %+v", rep)
	})
}

// an operation journaled with a custom key wire form (KeyHeader
// "X-Request-Key", or QuoteKey) must be resumed in that form, whoever
// resumes it.
func TestTheJournaledKeyFormIsUsedByWhoeverResumes(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg func(*idem.Config)
		// keyOf is the key the server honours, or "" when it sees none.
		keyOf func(*http.Request) string
	}{
		"KeyHeader X-Request-Key": {
			cfg:   func(c *idem.Config) { c.KeyHeader = "X-Request-Key" },
			keyOf: func(r *http.Request) string { return r.Header.Get("X-Request-Key") },
		},
		"QuoteKey": {
			cfg: func(c *idem.Config) { c.QuoteKey = true },
			keyOf: func(r *http.Request) string { // only the RFC 8941 sf-string form
				if v := r.Header.Get("Idempotency-Key"); len(v) > 2 && v[0] == '"' && v[len(v)-1] == '"' {
					return v
				}
				return ""
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			// A server that honours only its own key form: it stores each
			// key's answer and replays it; a request without a key it
			// recognises just runs.
			var (
				mu         sync.Mutex
				wireForms  []string
				executions atomic.Int32
				stored     = map[string][]byte{}
				dropping   atomic.Bool
			)
			dropping.Store(true)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				key := tc.keyOf(r)
				mu.Lock()
				wireForms = append(wireForms, fmt.Sprintf("X-Request-Key=%q Idempotency-Key=%q",
					r.Header.Get("X-Request-Key"), r.Header.Get("Idempotency-Key")))
				body, seen := stored[key]
				if key == "" || !seen {
					n := executions.Add(1)
					body = []byte(fmt.Sprintf(`{"order_id":"ord_%d"}`, n))
					if key != "" {
						stored[key] = body
					}
				}
				mu.Unlock()
				if dropping.Load() { // the answer is lost: the outcome is unknown
					dropConn(w)
					return
				}
				if seen {
					w.Header().Set("Idempotent-Replayed", "true")
				}
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write(body)
			}))
			t.Cleanup(srv.Close)
			j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
			policy := fastRetry()
			policy.MaxStatusChecks = 1

			cfg := idem.Config{Journal: j, BaseURL: srv.URL, Retry: policy}
			tc.cfg(&cfg)
			custom, err := idem.New(cfg)
			require.NoError(t, err)
			_, err = custom.Do(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{"item":"book"}`)})
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			require.NoError(t, custom.Close())
			require.EqualValues(t, 1, executions.Load(), "the order was created once")

			dropping.Store(false)
			time.Sleep(50 * time.Millisecond) // due
			def, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry()})
			rep, err := def.Resume(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, rep.Claimed)
			mu.Lock()
			first, last := wireForms[0], wireForms[len(wireForms)-1]
			mu.Unlock()
			assert.Equal(t, first, last, "the resume re-sent the write in the resuming client's key form, not the journaled one")
			assert.EqualValues(t, 1, executions.Load(), "the server ran the order handler twice")
			rec, err := j.Lookup(ctx, "default", "order-1")
			require.NoError(t, err)
			assert.Equal(t, idem.StateSucceeded, rec.State)
			assert.True(t, rec.Response.Replayed, "the resume got the stored answer")
		})
	}
}

// after a SIGKILL, the restarted process's first Resume takes the
// dead process's operation at once, or at least says it skipped it.
func TestFirstResumeTakesAKilledProcessesOperation(t *testing.T) {
	t.Parallel()
	srv := newHoldServer(t)
	path := filepath.Join(t.TempDir(), "ops.db")
	openJournal(t, path).Close()
	child := startHoldChild(t, "IDEM_JOURNAL="+path, "IDEM_URL="+srv.URL, "IDEM_OP=charge-1", "IDEM_PATH=/hold")
	srv.waitArrival(t, "/hold")

	j := openJournal(t, path)
	c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry()}) // default LeaseDuration (15 s)
	ctx := context.Background()
	rep, err := c.Resume(ctx)
	require.NoError(t, err)
	assert.Zero(t, rep.Claimed, "a live owner's operation is never taken")
	assert.Equal(t, 1, rep.Leased, "the report says what it left alone, and why: %+v", rep)

	require.NoError(t, child.Signal(syscall.SIGKILL))
	_, _ = child.Wait() // the process is gone, as it is when its restart begins
	srv.hold.Store(false)
	rec, err := j.Lookup(ctx, "default", "charge-1")
	require.NoError(t, err)
	start := time.Now()
	rep, err = c.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Claimed, "the first Resume after the SIGKILL claimed nothing (took %s): the dead process's lease (owner %q) runs until %s; report %+v",
		time.Since(start).Round(time.Millisecond), rec.Lease.Owner, rec.Lease.ExpiresAt.Format(time.RFC3339Nano), rep)
	assert.Equal(t, 1, rep.Succeeded, "report %+v", rep)
	assert.Zero(t, rep.Leased)
	h, err := j.History(ctx, rec.Key)
	require.NoError(t, err)
	var claim idem.Event
	for _, e := range h {
		if e.Kind == idem.EventClaim && e.Owner == c.Owner() {
			claim = e
		}
	}
	assert.Equal(t, "taken over from "+rec.Lease.Owner+": its owner is gone", claim.Detail, "the history says who took it from whom, and why")
}

// with a fixed Config.Owner, a restarted process must not keep the
// dead process's lease alive by renewing leases by name.
func TestARestartUnderTheSameOwnerNameNeverRenewsTheDeadLease(t *testing.T) {
	t.Parallel()
	srv := newHoldServer(t)
	path := filepath.Join(t.TempDir(), "ops.db")
	openJournal(t, path).Close()
	const owner, lease = "pod-1", 1500 * time.Millisecond
	child := startHoldChild(t, "IDEM_JOURNAL="+path, "IDEM_URL="+srv.URL, "IDEM_OP=charge-1", "IDEM_PATH=/hold",
		"IDEM_OWNER="+owner, "IDEM_LEASE="+lease.String())
	srv.waitArrival(t, "/hold")

	// The restarted pod: same Owner name, busy with another operation, so
	// its renewer runs.
	j := openJournal(t, path)
	c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Owner: owner, LeaseDuration: lease, Retry: fastRetry()})
	ctx := context.Background()
	busy := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, idem.Op{ID: "other", URL: "/slow", Body: []byte(`{}`)})
		busy <- err
	}()
	srv.waitArrival(t, "/slow")
	require.NoError(t, child.Signal(syscall.SIGKILL))
	killed := time.Now()
	srv.hold.Store(false)

	time.Sleep(lease + time.Second) // well past the dead process's lease
	rec, err := j.Lookup(ctx, "default", "charge-1")
	require.NoError(t, err)
	assert.True(t, rec.Lease.ExpiresAt.Before(time.Now()),
		"the dead process's lease was renewed by the new process (same Owner %q): it now runs until %s, %s after the kill",
		owner, rec.Lease.ExpiresAt.Format(time.RFC3339Nano), rec.Lease.ExpiresAt.Sub(killed).Round(time.Millisecond))
	rep, err := c.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Claimed, "%s after the SIGKILL, Resume still cannot take the dead process's operation: report %+v",
		time.Since(killed).Round(time.Millisecond), rep)
	require.NoError(t, <-busy)
}

// an unknown operation past Retention is expired by Resume without a
// network call, whatever its next-attempt time.
func TestResumeExpiresPastRetentionWithoutACall(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	policy := fastRetry()
	policy.MaxBackoff = 5 * time.Second // the default: an unsettled call is due 5 s later
	policy.MaxStatusChecks = 1
	c, j := acceptanceClient(t, srv, func(c *idem.Config) {
		c.Retention = 300 * time.Millisecond
		c.Retry = policy
	})
	ctx := context.Background()
	srv.Inject(testserver.DropAfterCommit)
	srv.InjectStatus(testserver.StatusDown)
	_, err := c.Do(ctx, orderOp("retention/op", 1))
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	rec, err := j.Lookup(ctx, "default", "retention/op")
	require.NoError(t, err)
	require.Equal(t, idem.StateUnknown, rec.State)
	time.Sleep(time.Until(rec.ExpiresAt) + 100*time.Millisecond)
	requests, statusRequests := srv.Requests(), srv.StatusRequests()

	rep, err := c.Resume(ctx)
	require.NoError(t, err)
	rec, err = j.Lookup(ctx, "default", "retention/op")
	require.NoError(t, err)
	assert.Equal(t, idem.StateExpired.String(), rec.State.String(),
		"past retention (ended %s ago) the operation is still %s after Resume (next attempt in %s); report %+v",
		time.Since(rec.ExpiresAt).Round(time.Millisecond), rec.State, time.Until(rec.NextAttemptAt).Round(time.Millisecond), rep)
	assert.Equal(t, requests, srv.Requests())
	assert.Equal(t, statusRequests, srv.StatusRequests())
}

// a 409 the server replays from its store is the handler's own
// answer: a definitive rejection after one POST.
func TestAReplayed409IsDefinitive(t *testing.T) {
	t.Parallel()
	var log hitLog
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.add(r)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write([]byte(`{"error":"order already shipped"}`))
	}))
	t.Cleanup(srv.Close)
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
	ctx := context.Background()
	res, err := c.Do(ctx, idem.Op{ID: "cancel-order-9", URL: "/orders/9/cancel", Body: []byte(`{}`)})
	rec, lerr := j.Lookup(ctx, "default", "cancel-order-9")
	require.NoError(t, lerr)
	assert.NotErrorIs(t, err, idem.ErrOutcomeUnknown, "a replayed 409 ended unknown")
	assert.ErrorIs(t, err, idem.ErrRejected, "a replayed 409 is a definitive rejection")
	assert.NotErrorIs(t, err, idem.ErrKeyConflict)
	assert.Equal(t, 1, log.count(http.MethodPost), "a replayed 409 made Do send %d POSTs (journaled attempts: %d)", log.count(http.MethodPost), rec.Attempts)
	assert.Equal(t, idem.StateRejected.String(), rec.State.String(), "journaled %s, last error %q", rec.State, rec.LastError)
	if assert.NotNil(t, res, "no Result for a definitive answer (err: %v)", err) {
		assert.Equal(t, http.StatusConflict, res.StatusCode)
	}
}

// a plain 422 validation error is an ordinary rejection, not a key
// conflict.
func TestAPlain422IsAnOrdinaryRejection(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = w.Write([]byte(`{"error":"quantity must be positive"}`))
	}))
	t.Cleanup(srv.Close)
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
	ctx := context.Background()
	res, err := c.Do(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{"quantity":-1}`)})
	assert.NotErrorIs(t, err, idem.ErrKeyConflict, "a plain 422 validation error was reported as a key conflict: %v", err)
	require.ErrorIs(t, err, idem.ErrRejected)
	var oe *idem.OperationError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, http.StatusUnprocessableEntity, oe.StatusCode)
	assert.JSONEq(t, `{"error":"quantity must be positive"}`, string(oe.Body), "the error carries the server's answer")
	rec, lerr := j.Lookup(ctx, "default", "order-1")
	require.NoError(t, lerr)
	assert.NotContains(t, rec.LastError, "key used with another request", "journaled as a key conflict")
	if assert.NotNil(t, res, "no Result for an ordinary 422 rejection (err: %v)", err) {
		assert.Equal(t, http.StatusUnprocessableEntity, res.StatusCode)
	}
}

// every re-send a ReplayStatus check makes is an attempt, journaled.
func TestReplaysToCheckStatusAreAttempts(t *testing.T) {
	t.Parallel()
	var log hitLog
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if log.add(r) <= 4 { // a concurrent duplicate is still running
			w.WriteHeader(http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), Status: idem.ReplayStatus()})
	ctx := context.Background()
	res, err := c.Do(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
	require.NoError(t, err)
	rec, err := j.Lookup(ctx, "default", "order-1")
	require.NoError(t, err)
	posts := log.count(http.MethodPost)
	assert.Equal(t, posts, rec.Attempts, "the server saw %d POSTs, the journal counts %d attempts (Result.Attempts %d)", posts, rec.Attempts, res.Attempts)
	h, err := j.History(ctx, rec.Key)
	require.NoError(t, err)
	replays := 0
	for _, e := range h {
		if e.Kind == idem.EventSend && strings.Contains(e.Detail, "replay") {
			replays++
		}
	}
	assert.Equal(t, posts-1, replays, "every replay is in the history")
}

// A driver whose lease was taken over during a status round stops: its
// next replay is fenced by the journal before anything is sent.
func TestAReplayIsFencedByTheLease(t *testing.T) {
	t.Parallel()
	var log hitLog
	path := filepath.Join(t.TempDir(), "ops.db")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := log.add(r)
		if n == 2 {
			takeOverAll(t, path) // during the first replay
		}
		w.WriteHeader(http.StatusConflict) // in progress, again and again
	}))
	t.Cleanup(srv.Close)
	j := openJournal(t, path)
	c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry(), Status: idem.ReplayStatus()})
	_, err := c.Do(context.Background(), idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
	require.ErrorIs(t, err, idem.ErrLeaseLost, "the driver learnt it lost its lease")
	assert.Equal(t, 2, log.count(http.MethodPost), "no replay was sent after the lease was taken over")
}

// Retry-After: 3600 is honoured: the operation is not due again
// before the server's time.
func TestALongRetryAfterIsScheduledNotCut(t *testing.T) {
	t.Parallel()
	var log hitLog
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.add(r)
		w.Header().Set("Retry-After", "3600")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(srv.Close)
	c, j := newClient(t, idem.Config{BaseURL: srv.URL}) // the default RetryPolicy
	ctx := context.Background()
	start := time.Now()
	_, err := c.Do(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
	require.ErrorIs(t, err, idem.ErrNotSent)
	rec, err := j.Lookup(ctx, "default", "order-1")
	require.NoError(t, err)
	assert.Equal(t, 1, log.count(http.MethodPost), "the call re-sent before the server's time")
	assert.False(t, rec.NextAttemptAt.Before(start.Add(3590*time.Second)),
		"the server asked for 3600 s; the operation is due again %s after the call", rec.NextAttemptAt.Sub(start).Round(time.Millisecond))
	rep, err := c.Resume(ctx)
	require.NoError(t, err)
	assert.Zero(t, rep.Claimed)
	assert.Equal(t, 1, rep.NotDue, "the report says it left one not due, and until when")
	assert.WithinDuration(t, rec.NextAttemptAt, rep.NextDue, time.Millisecond)
	assert.Equal(t, 1, log.count(http.MethodPost), "Resume did not hit the rate-limited API")
}

// a clean exit (Do succeeded, Client.Close, exit) leaves the outcome
// committed.
func TestACleanExitLosesNothing(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	path := filepath.Join(t.TempDir(), "ops.db")
	openJournal(t, path).Close()
	const runs = 10
	for i := range runs {
		out, err := childCommand(t, "clean-exit", "IDEM_JOURNAL="+path, "IDEM_URL="+srv.URL,
			"IDEM_OP=exit-"+strconv.Itoa(i)).Output()
		require.NoError(t, err, "child %d: %s", i, out)
	}
	j := openJournal(t, path)
	inFlight := 0
	for i := range runs {
		rec, err := j.Lookup(context.Background(), "default", "exit-"+strconv.Itoa(i))
		require.NoError(t, err)
		if rec.State != idem.StateSucceeded {
			inFlight++
		}
	}
	assert.Zero(t, inFlight, "after Do succeeded, Client.Close and a clean exit, %d of %d journals still read in_flight", inFlight, runs)
}

// Shutdown lets a call in progress finish, refuses new ones, and leaves the
// outcome committed; when its context ends first, it interrupts the call,
// whose operation stays journaled.
func TestShutdownLetsCallsFinish(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	arrived := make(chan struct{}, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			arrived <- struct{}{}
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	path := filepath.Join(t.TempDir(), "ops.db")
	j := openJournal(t, path, idem.SQLiteLingerDelay(time.Hour)) // nothing commits a buffered write but Shutdown
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry()})
	require.NoError(t, err)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, idem.Op{ID: "slow", URL: "/slow"})
		done <- err
	}()
	<-arrived
	shut := make(chan error, 1)
	go func() { shut <- c.Shutdown(ctx) }()
	late := 0
	require.Eventually(t, func() bool {
		late++
		_, err := c.Do(ctx, idem.Op{ID: fmt.Sprint("late-", late), URL: "/orders"})
		return errors.Is(err, idem.ErrClientClosed)
	}, 5*time.Second, time.Millisecond, "a new call is refused once Shutdown began")
	release <- struct{}{}
	require.NoError(t, <-done, "the call in progress finished")
	require.NoError(t, <-shut)
	rec, err := idem.OpenSQLite(path)
	require.NoError(t, err)
	defer rec.Close()
	got, err := rec.Lookup(ctx, "default", "slow")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, got.State, "Shutdown made the buffered success durable")

	// A Shutdown whose context ends first interrupts the call.
	c2, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry()})
	require.NoError(t, err)
	go func() {
		_, err := c2.Do(ctx, idem.Op{ID: "interrupted", URL: "/slow"})
		done <- err
	}()
	<-arrived
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	serr := c2.Shutdown(sctx)
	require.ErrorIs(t, serr, context.DeadlineExceeded)
	require.ErrorContains(t, serr, "durable", "its context left no time to make the journal durable, and Shutdown says so")
	err = <-done
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "interrupted mid-request: it may have been applied")
	got, err = rec.Lookup(ctx, "default", "interrupted")
	require.NoError(t, err)
	assert.Equal(t, idem.StateInFlight, got.State, "it stays journaled for Resume: its intent, on disk before the request went out")
	require.NoError(t, j.Sync(ctx), "the caller makes the journal durable itself")
	got, err = rec.Lookup(ctx, "default", "interrupted")
	require.NoError(t, err)
	assert.Equal(t, idem.StateUnknown, got.State, "and the interrupted call's outcome is durable")
	require.NoError(t, c2.Close(), "Close after Shutdown is harmless")
}

// a definitive rejection is an error.
func TestARejectionIsAnError(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"card declined"}`, http.StatusBadRequest)
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
	res, err := c.Do(context.Background(), idem.Op{ID: "charge-1", URL: "/charges", Body: []byte(`{}`)})
	state := "no result"
	if res != nil {
		state = fmt.Sprintf("%s, HTTP %d", res.State, res.StatusCode)
	}
	require.Error(t, err, "Do returned err == nil for a 400 (%s)", state)
	assert.ErrorIs(t, err, idem.ErrRejected)
	var oe *idem.OperationError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, idem.StateRejected, oe.State)
	assert.Equal(t, http.StatusBadRequest, oe.StatusCode)
	assert.Contains(t, string(oe.Body), "card declined")
	require.NotNil(t, res, "the Result comes with the error")
	assert.Equal(t, idem.StateRejected, res.State)
	assert.Equal(t, http.StatusBadRequest, res.StatusCode)

	// Asked again, the journal answers the same, and nothing is sent.
	res, err = c.Do(context.Background(), idem.Op{ID: "charge-1", URL: "/charges", Body: []byte(`{}`)})
	require.ErrorIs(t, err, idem.ErrRejected)
	assert.True(t, res.Journaled)
}

// two unrelated applications must not compute the same
// deterministic key for the same (scope, ID).
func TestDeterministicKeysNeedTheApplicationsNamespace(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	ctx := context.Background()
	// Without a namespace of its own, or with a public one, New refuses.
	j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
	for _, ns := range []uuid.UUID{uuid.Nil, uuid.NameSpaceURL, uuid.MustParse("3f1c9a4e-6d2b-5e8f-9a7c-1b2d3e4f5a6b")} {
		_, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Keys: idem.KeyDeterministic, KeyNamespace: ns})
		require.ErrorIs(t, err, idem.ErrInvalidConfig, "namespace %s", ns)
		assert.Contains(t, err.Error(), "Config.KeyNamespace")
	}
	appA, _ := acceptanceClient(t, srv, func(c *idem.Config) { c.Keys, c.KeyNamespace = idem.KeyDeterministic, uuid.New() })
	appB, _ := acceptanceClient(t, srv, func(c *idem.Config) { c.Keys, c.KeyNamespace = idem.KeyDeterministic, uuid.New() })
	a, err := appA.Do(ctx, orderOp("checkout/cart-1", 1))
	require.NoError(t, err)
	b, err := appB.Do(ctx, orderOp("checkout/cart-1", 1))
	require.NoError(t, err)
	assert.NotEqual(t, a.Key, b.Key, "two applications with their own namespaces computed the same key from (scope, ID)")
	assert.False(t, b.Replayed, "application B got application A's stored answer (%s) replayed", b.Body)
}

// Client.Close closes the transport's idle connections (no readLoop
// goroutine outlives it).
func TestCloseLeavesNoConnectionBehind(t *testing.T) {
	// Not parallel: it counts the process's goroutines.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close) // closes the connection, after the check
	readLoops := func() int {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		return bytes.Count(buf, []byte("net/http.(*persistConn).readLoop"))
	}
	before := readLoops()
	j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL})
	require.NoError(t, err)
	_, err = c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders"})
	require.NoError(t, err)
	require.NoError(t, c.Close())
	deadline := time.Now().Add(2 * time.Second)
	for readLoops() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	assert.Equal(t, before, readLoops(), "a transport readLoop goroutine outlived Client.Close (2 s later)")
}

// a response cut off mid-body may have been applied: it is unknown,
// never ErrNotSent. Several ways of cutting it; the one that reproduces is
// a server that answers (201 and part of its body) before it has read the
// whole request, then closes: the client's write fails, and the attempt is
// classified "not sent" although a response had begun.
func TestACutResponseIsUnknownNeverNotSent(t *testing.T) {
	t.Parallel()
	const body = `{"order_id":"ord_1","padding":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`
	hijackHead := func(w http.ResponseWriter, part string, rst bool) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		fmt.Fprintf(buf, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), part)
		_ = buf.Flush()
		if tc, ok := conn.(*net.TCPConn); ok && rst {
			_ = tc.SetLinger(0)
		}
		_ = conn.Close()
	}
	type variant struct {
		bigRequest bool // 900 KiB, and the server answers before reading it
		runs       int
		cut        func(w http.ResponseWriter)
	}
	variants := map[string]variant{
		"201 with Content-Length larger than the body": {runs: 1, cut: func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(body[:10]))
		}},
		"hijacked, half the body, FIN": {runs: 1, cut: func(w http.ResponseWriter) { hijackHead(w, body[:len(body)/2], false) }},
		"hijacked, half the body, RST": {runs: 1, cut: func(w http.ResponseWriter) { hijackHead(w, body[:len(body)/2], true) }},
		"hijacked, headers only, FIN":  {runs: 1, cut: func(w http.ResponseWriter) { hijackHead(w, "", false) }},
		"answered before the request body was read, then closed": {bigRequest: true, runs: 50,
			cut: func(w http.ResponseWriter) { hijackHead(w, body[:10], false) }},
	}
	for name, v := range variants {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var log hitLog
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				log.add(r)
				if r.Method == http.MethodGet { // the status endpoint is down
					http.Error(w, "down", http.StatusInternalServerError)
					return
				}
				if !v.bigRequest {
					_, _ = io.Copy(io.Discard, r.Body)
				}
				v.cut(w)
			}))
			t.Cleanup(srv.Close)
			policy := fastRetry()
			policy.MaxStatusChecks = 1
			policy.MaxAttempts = 1
			c, j := newClient(t, idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/status"), Retry: policy})
			ctx := context.Background()
			reqBody := []byte(`{}`)
			if v.bigRequest {
				reqBody = bytes.Repeat([]byte("a"), 900<<10)
			}
			outcomes := map[string]int{}
			for i := range v.runs {
				id := "order-" + strconv.Itoa(i)
				_, err := c.Do(ctx, idem.Op{ID: id, URL: "/orders", Body: reqBody})
				rec, lerr := j.Lookup(ctx, "default", id)
				require.NoError(t, lerr)
				outcomes[rec.State.String()]++
				if !assert.NotErrorIs(t, err, idem.ErrNotSent, "run %d of %d: a 201 cut off mid-body was reported as not sent (journaled %s, last error %q); outcomes so far %v",
					i+1, v.runs, rec.State, rec.LastError, outcomes) {
					return
				}
				assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			}
			t.Logf("outcomes of %d runs: %v", v.runs, outcomes)
		})
	}
}

// a 307 to the same origin is not a final rejection: it is followed
// with the key, or the error says what was done and why.
func TestSameOriginRedirectsAreFollowedWithTheKey(t *testing.T) {
	t.Parallel()
	var log hitLog
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.add(r)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(elsewhere.Close)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		log.add(r)
		http.Redirect(w, r, "/v2/orders", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("POST /v2/orders", func(w http.ResponseWriter, r *http.Request) {
		log.add(r)
		body, _ := io.ReadAll(r.Body)
		if string(body) != `{"item":"book"}` {
			http.Error(w, "the body did not follow", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("POST /moved", func(w http.ResponseWriter, r *http.Request) {
		log.add(r)
		http.Redirect(w, r, elsewhere.URL+"/orders", http.StatusPermanentRedirect)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(),
		Authorize: func(r *http.Request) error { r.Header.Set("Authorization", "Bearer secret"); return nil }})
	res, err := c.Do(context.Background(), idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{"item":"book"}`)})
	require.NoError(t, err, "a same-origin 307 is followed")
	assert.Equal(t, http.StatusCreated, res.StatusCode)
	hits := log.all()
	require.Len(t, hits, 2)
	assert.Equal(t, "/v2/orders", hits[1].Path)
	assert.Equal(t, res.Key, hits[1].IdemKey, "with the same key")
	assert.Equal(t, "Bearer secret", hits[1].Auth, "Authorize ran again")

	// Another origin: not followed, and the rejection says why.
	res, err = c.Do(context.Background(), idem.Op{ID: "order-2", URL: "/moved", Body: []byte(`{"item":"book"}`)})
	require.ErrorIs(t, err, idem.ErrRejected)
	assert.Contains(t, err.Error(), "another origin")
	assert.Equal(t, http.StatusPermanentRedirect, res.StatusCode)
	assert.Len(t, log.all(), 3, "nothing was sent to the other origin")
}

// a body cut at MaxResponseBytes during a ReplayStatus check is
// noted in the journal, as it is on a first attempt.
func TestAReplayedBodyCutAtTheLimitIsNoted(t *testing.T) {
	t.Parallel()
	full := []byte(`{"order_id":"ord_1","padding":"` + strings.Repeat("x", 100) + `"}`)
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if n.Add(1) == 1 && r.URL.Path == "/orders" { // applied, answer lost
			dropConn(w)
			return
		}
		if r.URL.Path == "/orders" {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(full)
	}))
	t.Cleanup(srv.Close)
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), Status: idem.ReplayStatus(), MaxResponseBytes: 16})
	ctx := context.Background()

	// Control: the same cut on a first attempt is noted.
	_, err := c.Do(ctx, idem.Op{ID: "control", URL: "/control", Body: []byte(`{}`)})
	require.NoError(t, err)
	ctl, err := j.Lookup(ctx, "default", "control")
	require.NoError(t, err)
	require.Len(t, ctl.Response.Body, 16)
	require.Contains(t, ctl.LastError, "cut")

	n.Store(0)
	_, err = c.Do(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
	require.NoError(t, err)
	rec, err := j.Lookup(ctx, "default", "order-1")
	require.NoError(t, err)
	require.Len(t, rec.Response.Body, 16, "the replayed body was cut at MaxResponseBytes")
	assert.Contains(t, rec.LastError, "cut", "the journal holds a %d-byte body cut from %d bytes and does not say so (LastError %q; a first attempt's cut reads %q)",
		len(rec.Response.Body), len(full), rec.LastError, ctl.LastError)
}

// warnLog collects the messages of records at warn level or above.
type warnLog struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnLog) Enabled(_ context.Context, l slog.Level) bool { return true }
func (w *warnLog) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return nil
	}
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	w.mu.Lock()
	w.msgs = append(w.msgs, b.String())
	w.mu.Unlock()
	return nil
}
func (w *warnLog) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnLog) WithGroup(string) slog.Handler      { return w }
func (w *warnLog) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// a status endpoint of the wrong shape: the error, LastError and the
// log say why the status check failed.
func TestAFailedStatusCheckSaysWhy(t *testing.T) {
	t.Parallel()
	for name, policy := range map[string]idem.RetryPolicy{
		"the call's budget runs out": {MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Budget: time.Second, MaxStatusChecks: 100},
		"MaxStatusChecks runs out":   {MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, MaxStatusChecks: 6},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var log hitLog
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				log.add(r)
				_, _ = io.Copy(io.Discard, r.Body)
				if r.Method == http.MethodGet {
					w.Header().Set("Content-Type", "application/json")
					_, _ = w.Write([]byte(`{"status":"done"}`))
					return
				}
				dropConn(w) // applied, answer lost: unknown
			}))
			t.Cleanup(srv.Close)
			logs := &warnLog{}
			c, j := newClient(t, idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/status"), Retry: policy,
				Logger: slog.New(logs)})
			ctx := context.Background()
			_, err := c.Do(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			rec, lerr := j.Lookup(ctx, "default", "order-1")
			require.NoError(t, lerr)
			checks := log.count(http.MethodGet)
			assert.ErrorIs(t, err, idem.ErrBadStatus, "after %d status checks answering {\"status\":\"done\"}, the error does not match ErrBadStatus: %v", checks, err)
			assert.Contains(t, rec.LastError, "state", "LastError does not say what was wrong with the status answer")
			found := 0
			for _, m := range logs.all() {
				if strings.Contains(m, "state") || strings.Contains(m, "status format") {
					found++
				}
			}
			assert.Equal(t, 1, found, "one warn-level log mentions the bad status answer, the first time; warn logs: %q", logs.all())
			assert.Contains(t, err.Error(), "status endpoint "+srv.URL+"/status", "the error names the checker")
			var oe *idem.OperationError
			require.ErrorAs(t, err, &oe)
			assert.Equal(t, rec.LastError, oe.Err.Error(), "the error and the journal say the same")
		})
	}
}

// the history tells the whole story: no version gap at a claim, and
// each status check recorded.
func TestTheHistoryTellsTheWholeStory(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	policy := fastRetry()
	policy.MaxStatusChecks = 2
	c, j := acceptanceClient(t, srv, func(c *idem.Config) { c.Retry = policy })
	ctx := context.Background()
	srv.Inject(testserver.DropAfterCommit)
	srv.InjectStatusN(testserver.StatusDown, 2)
	_, err := c.Do(ctx, orderOp("history/op", 1))
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	time.Sleep(50 * time.Millisecond) // due
	rep, err := c.Resume(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Succeeded)
	rec, err := j.Lookup(ctx, "default", "history/op")
	require.NoError(t, err)
	h, err := j.History(ctx, rec.Key)
	require.NoError(t, err)
	var lines []string
	for _, e := range h {
		lines = append(lines, fmt.Sprintf("v%d %s→%s attempt %d %q owner %q", e.Version, e.From, e.To, e.Attempt, e.Error, e.Owner))
	}
	story := strings.Join(lines, "\n\t")
	for i, e := range h {
		if !assert.EqualValues(t, i+1, e.Version, "the history jumps to version %d after version %d (record version %d):\n\t%s", e.Version, i, rec.Version, story) {
			break
		}
	}
	checks := srv.StatusRequests()
	assert.GreaterOrEqual(t, len(h), 1+checks+1, "%d status checks were made (2 failed, 1 answered completed), but the history has %d events:\n\t%s", checks, len(h), story)
	kinds := map[idem.EventKind]int{}
	for _, e := range h {
		kinds[e.Kind]++
	}
	assert.Equal(t, 1, kinds[idem.EventCreate], story)
	assert.Equal(t, checks, kinds[idem.EventStatus], "every status check is an event:\n\t%s", story)
	assert.Equal(t, 1, kinds[idem.EventClaim], "Resume's claim is an event:\n\t%s", story)
	last := h[len(h)-1]
	assert.Equal(t, idem.EventStatus, last.Kind)
	assert.Contains(t, last.Detail, "completed, HTTP 201")
}

// Result.Attempts stays within MaxAttempts when the transport
// re-sends on its own (those are reported apart).
func TestTransportResendsAreCountedApart(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	policy := fastRetry()
	policy.MaxAttempts = 5
	proxy := startFaultProxy(t, srv.URL, faultproxy.Config{RetryAfter: -1, Script: []faultproxy.Fault{
		faultproxy.Pass,                                                  // warm-up: a keep-alive connection stays in the pool
		faultproxy.DropResponse,                                          // attempt 1 on the reused connection: committed, then dropped
		faultproxy.Answer429,                                             // net/http's silent re-send on a new connection
		faultproxy.Answer429, faultproxy.Answer429, faultproxy.Answer429, // attempts 2–4
		faultproxy.Pass, // attempt 5: the stored answer
	}})
	c, j := newClient(t, idem.Config{BaseURL: proxy.URL, Status: idem.StatusEndpoint(proxy.URL + "/idempotency"),
		Retry: policy, AttemptTimeout: 5 * time.Second})
	ctx := context.Background()
	_, err := c.Do(ctx, orderOp("hidden/warm-up", 1))
	require.NoError(t, err)
	res, err := c.Do(ctx, orderOp("hidden/op", 1))
	require.NoError(t, err)
	require.Equal(t, 7, proxy.Stats().Requests, "1 warm-up + the hidden write + its silent re-send + 4 attempts")
	assert.LessOrEqual(t, res.Attempts, policy.MaxAttempts, "Result.Attempts %d with MaxAttempts %d (the transport's silent re-send is counted as an attempt)", res.Attempts, policy.MaxAttempts)
	assert.Equal(t, 1, res.TransportResends, "the transport's silent re-send is reported apart")
	h, err := j.History(ctx, res.Key)
	require.NoError(t, err)
	told := 0
	for _, e := range h {
		if strings.Contains(e.Detail, "the transport sent it again 1 time(s)") {
			told++
		}
	}
	assert.Equal(t, 1, told, "the history tells of the transport's re-send once")
}

// A start-up hook can ask Resume to finish everything it can: it waits for
// what is not due yet, and for leases held elsewhere to end.
func TestResumeWaitFinishesWhatIsNotDueYet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addr := freeAddr(t)
	policy := fastRetry()
	policy.MaxBackoff = 300 * time.Millisecond // due again 300 ms after a failed call
	c, _ := newClient(t, idem.Config{BaseURL: "http://" + addr, Retry: policy})
	_, err := c.Do(ctx, idem.Op{ID: "op", URL: "/orders"})
	require.ErrorIs(t, err, idem.ErrNotSent)
	var api hitLog
	serveAt(t, addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { api.add(r); w.WriteHeader(201) }))

	rep, err := c.Resume(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.NotDue, "one pass leaves what is not due: %+v", rep)

	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rep, err = c.Resume(wctx, idem.ResumeWait())
	require.NoError(t, err, "ResumeWait returns once nothing is left, before its deadline")
	assert.Equal(t, 1, rep.Succeeded, "report %+v", rep)
	assert.Zero(t, rep.NotDue)
	assert.Len(t, api.all(), 1)
}

// An operation a pass of ResumeWait leaves unsettled and a later pass
// settles is counted once, where it ended: the report does not keep a
// record of what it settled, only of what it may take up again.
func TestResumeWaitCountsAnOperationOnceWhereItEnded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var api hitLog
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		api.add(r)
		if n == 1 {
			w.WriteHeader(http.StatusTooManyRequests) // refused before processing: not sent
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	policy := fastRetry()
	policy.MaxAttempts = 1
	policy.MaxBackoff = 100 * time.Millisecond
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy})
	o, err := c.Begin(ctx, idem.Op{ID: "op", URL: "/orders"})
	require.NoError(t, err)

	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var progress []idem.ResumeReport
	c2, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Retry: policy,
		OnResumeProgress: func(r idem.ResumeReport) { progress = append(progress, r) }})
	rep, err := c2.Resume(wctx, idem.ResumeWait())
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Claimed, "one operation: %+v", rep)
	assert.Equal(t, 1, rep.Succeeded)
	assert.Zero(t, rep.Remaining(), "its first outcome (pending) no longer counts: %+v", rep)
	require.Len(t, progress, 2, "one progress report per time it was driven")
	assert.Equal(t, 1, progress[0].Pending)
	assert.Equal(t, 1, progress[0].Claimed)
	assert.Len(t, api.all(), 2)
	rec, err := j.Get(ctx, o.Key())
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
}

// staleNotFound is the status endpoint whose first not_found comes back
// only after the write held in a gateway was released and holds the key in
// progress on the server: true when the server gave it, stale when the
// client acts on it. While the key is processing it asks the client to wait
// 200 ms before asking again, so that MaxStatusChecks outlasts the hold.
type staleNotFound struct {
	next    idem.StatusChecker
	release func()
	once    sync.Once
}

func (s *staleNotFound) CheckStatus(ctx context.Context, q idem.StatusQuery) (idem.Status, error) {
	st, err := s.next.CheckStatus(ctx, q)
	if err == nil && st.State == idem.StatusProcessing && st.RetryAfter == 0 {
		st.RetryAfter = 200 * time.Millisecond
	}
	if err != nil || st.State != idem.StatusNotFound {
		return st, err
	}
	var werr error
	s.once.Do(func() {
		s.release()
		for {
			now, err := s.next.CheckStatus(ctx, q)
			if err != nil || now.State != idem.StatusNotFound {
				werr = err
				return
			}
			select {
			case <-ctx.Done():
				werr = ctx.Err()
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	return st, werr
}

// Attempt 1's answer is lost and the attempt held by a gateway; the status
// endpoint says not_found, and attempt 1 reaches the server before the
// client acts on that, so attempt 2 is sent (same key) and meets attempt 1
// in progress: the server answers 409 in progress, and that answer is cut
// mid-body. The status endpoint then reports the key's one answer, 201.
// One order; the client should report it succeeded.
func TestACutInProgressAnswerIsNotTheKeysAnswer(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	srv.Inject(testserver.SlowHandler(time.Second)) // attempt 1, when it arrives, holds the key in progress
	proxy := startFaultProxy(t, srv.URL, faultproxy.Config{Script: []faultproxy.Fault{
		faultproxy.Pass,          // attempt 1, released by the first status check
		faultproxy.ResetResponse, // attempt 2: the server's 409 in progress, cut mid-body
	}})
	// The gateway and the status endpoint order the steps, not delays: the
	// client's default AttemptTimeout bounds its status checks and attempt
	// 2, which a loaded machine then cannot make outlast it.
	gateway, release, _ := holdFirstWrite(t, proxy.URL)
	j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
	c, err := idem.New(idem.Config{Journal: j, BaseURL: gateway,
		Status: &staleNotFound{next: idem.StatusEndpoint(gateway + "/idempotency"), release: release},
		Retry:  idem.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, MaxRetryAfter: 2 * time.Second, MaxStatusChecks: 20}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	res, err := c.Do(ctx, orderOp("op-1", 1))
	rec, _ := c.Lookup(ctx, "default", "op-1")
	h, _ := j.History(ctx, rec.Key)
	for _, e := range h {
		t.Logf("  %s -> %s %v %s", e.From, e.To, e.Kind, e.Detail)
	}
	t.Logf("orders on the server: %d; executions %d; proxy %v", srv.TotalOrders(), srv.Executions(), proxy.Stats())
	assert.Equal(t, 1, srv.TotalOrders())
	require.NoError(t, err, "Do")
	assert.Equal(t, idem.StateSucceeded, res.State)
}
