package idem_test

// Acceptance tests: the client against a real server (package server's
// middleware over the orders application, on 127.0.0.1) that injects
// faults per request and counts its side effects in a table with a UNIQUE
// constraint.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
)

func orderOp(id string, quantity int) idem.Op {
	return idem.Op{ID: id, URL: "/orders", Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(fmt.Sprintf(`{"item":"book","quantity":%d}`, quantity))}
}

func orderID(t *testing.T, body []byte) string {
	t.Helper()
	var o struct {
		OrderID string `json:"order_id"`
	}
	require.NoError(t, json.Unmarshal(body, &o), "body: %s", body)
	require.NotEmpty(t, o.OrderID)
	return o.OrderID
}

func acceptanceClient(t *testing.T, srv *testserver.Server, mod ...func(*idem.Config)) (*idem.Client, *idem.SQLiteJournal) {
	t.Helper()
	cfg := idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.StatusURL), Retry: fastRetry(),
		AttemptTimeout: 2 * time.Second}
	for _, m := range mod {
		m(&cfg)
	}
	return newClient(t, cfg)
}

func allSame(t *testing.T, keys []string, want string) {
	t.Helper()
	require.NotEmpty(t, keys)
	for i, k := range keys {
		assert.Equal(t, want, k, "request %d carried another key", i)
	}
}

// 1. The response is lost after the server committed: one order, and the
// client returns that order.
func TestAcceptanceResponseLostAfterCommit(t *testing.T) {
	t.Parallel()
	for name, status := range map[string]func(*testserver.Server) idem.StatusChecker{
		"status endpoint": func(s *testserver.Server) idem.StatusChecker { return idem.StatusEndpoint(s.StatusURL) },
		"replay":          func(*testserver.Server) idem.StatusChecker { return idem.ReplayStatus() },
	} {
		for _, fault := range []testserver.Fault{testserver.DropAfterCommit, testserver.ResetMidBody,
			testserver.HoldPastTimeout, testserver.StallMidBody, testserver.ServerErrorAfterCommit} {
			t.Run(name+"/"+fault.String(), func(t *testing.T) {
				t.Parallel()
				srv := testserver.Start(t)
				c, _ := acceptanceClient(t, srv, func(c *idem.Config) {
					c.Status = status(srv)
					// Only the faults that hold the answer until the client
					// gives up need a short AttemptTimeout; it also bounds
					// the status check or the re-send, which the others then
					// keep from depending on the machine's speed.
					if fault == testserver.HoldPastTimeout || fault == testserver.StallMidBody {
						c.AttemptTimeout = 300 * time.Millisecond
					}
				})
				srv.Inject(fault)
				res, err := c.Do(context.Background(), orderOp("checkout/cart-1", 1))
				require.NoError(t, err)
				assert.Equal(t, idem.StateSucceeded, res.State)
				assert.Equal(t, http.StatusCreated, res.StatusCode)
				assert.Equal(t, 1, srv.TotalOrders(), "exactly one order")
				assert.Equal(t, "ord_1", orderID(t, res.Body), "the client returns the first order")
				assert.True(t, res.Replayed, "the answer came from the server's store")
				allSame(t, srv.KeysSeen(), res.Key)
			})
		}
	}
}

// 2. The same operation from 50 goroutines at once: one order, one answer.
func TestAcceptanceFiftyGoroutinesOneOrder(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	c, _ := acceptanceClient(t, srv)
	srv.Inject(testserver.SlowHandler(200 * time.Millisecond))
	var wg sync.WaitGroup
	results := make([]*idem.Result, 50)
	errs := make([]error, 50)
	start := make(chan struct{})
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = c.Do(context.Background(), orderOp("checkout/cart-2", 1))
		}()
	}
	close(start)
	wg.Wait()
	for i := range results {
		require.NoError(t, errs[i])
		assert.Equal(t, results[0].Key, results[i].Key)
		assert.Equal(t, "ord_1", orderID(t, results[i].Body))
	}
	assert.Equal(t, 1, srv.TotalOrders())
	assert.Equal(t, 1, srv.Requests(), "one attempt on the wire")
}

// 3. Same ID, different quantity: refused, nothing sent, the first untouched.
func TestAcceptanceSameIDDifferentRequest(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	c, j := acceptanceClient(t, srv)
	ctx := context.Background()
	first, err := c.Do(ctx, orderOp("checkout/cart-3", 1))
	require.NoError(t, err)
	before, err := j.Get(ctx, first.Key)
	require.NoError(t, err)
	requests := srv.Requests()

	res, err := c.Do(ctx, orderOp("checkout/cart-3", 2))
	assert.Nil(t, res)
	require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
	assert.Equal(t, requests, srv.Requests(), "nothing may be sent")
	after, err := j.Get(ctx, first.Key)
	require.NoError(t, err)
	assert.Equal(t, before, after, "the first record is untouched")
	assert.Equal(t, 1, srv.TotalOrders())
}

// 4. Another tenant with the same operation ID gets its own key and its own
// order, never the other's.
func TestAcceptanceTenantsNeverShareResults(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	c, _ := acceptanceClient(t, srv)
	ctx := context.Background()
	do := func(tenant string) *idem.Result {
		op := orderOp("checkout/cart-4", 1)
		op.Scope = tenant
		op.Header.Set("X-Tenant", tenant)
		res, err := c.Do(ctx, op)
		require.NoError(t, err)
		return res
	}
	a, b := do("tenant-a"), do("tenant-b")
	assert.NotEqual(t, a.Key, b.Key)
	assert.NotEqual(t, orderID(t, a.Body), orderID(t, b.Body))
	assert.False(t, b.Replayed, "tenant-b's order was executed, not replayed from tenant-a's")
	assert.Equal(t, 1, srv.Orders("tenant-a"))
	assert.Equal(t, 1, srv.Orders("tenant-b"))
	again := do("tenant-a")
	assert.Equal(t, a.Body, again.Body, "tenant-a's own result, from its journal")
}

func init() {
	children["do-once"] = childDoOnce
}

// childDoOnce runs one Do for the operation named in the environment on a
// journal shared with the test, and prints the order ID and key. Its lease
// is short, so that a successor takes over soon after it is killed.
func childDoOnce() error {
	j, err := idem.OpenSQLite(os.Getenv("IDEM_JOURNAL"))
	if err != nil {
		return err
	}
	defer j.Close()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: os.Getenv("IDEM_URL"),
		Status: idem.StatusEndpoint(os.Getenv("IDEM_STATUS_URL")), LeaseDuration: time.Second,
		AttemptTimeout: 30 * time.Second})
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("started")
	var wg sync.WaitGroup
	out := make(chan string, 10)
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Do(context.Background(), orderOp(os.Getenv("IDEM_OP"), 1))
			if err != nil {
				out <- "error " + err.Error()
				return
			}
			var o struct {
				OrderID string `json:"order_id"`
			}
			_ = json.Unmarshal(res.Body, &o)
			out <- o.OrderID + " " + res.Key
		}()
	}
	wg.Wait()
	close(out)
	for line := range out {
		fmt.Println(line)
	}
	return nil
}

// 5. A process SIGKILLed after its request was written and before the
// outcome was journaled: on restart, Resume checks status and finds the one
// order; nothing was reported succeeded before it was confirmed.
func TestAcceptanceKilledMidRequestResumes(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	path := filepath.Join(t.TempDir(), "ops.db")
	srv.Inject(testserver.HoldPastTimeout) // the order is created, the answer never comes
	cmd := childCommand(t, "do-once", "IDEM_JOURNAL="+path, "IDEM_URL="+srv.URL,
		"IDEM_STATUS_URL="+srv.StatusURL, "IDEM_OP=checkout/cart-5")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(stdout)
	require.True(t, lines.Scan())
	require.Equal(t, "started", lines.Text())
	require.Eventually(t, func() bool { return srv.TotalOrders() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the server must have committed the order")
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	rest, _ := io.ReadAll(stdout)
	_ = cmd.Wait()
	assert.Empty(t, strings.TrimSpace(string(rest)), "the killed process reported nothing")

	j := openJournal(t, path)
	ctx := context.Background()
	rec, err := j.Lookup(ctx, "default", "checkout/cart-5")
	require.NoError(t, err)
	assert.Equal(t, idem.StateInFlight, rec.State, "killed mid-request, the journal says in_flight, not succeeded")

	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.StatusURL), Retry: fastRetry()})
	require.NoError(t, err)
	defer c.Close()
	requests, statusRequests := srv.Requests(), srv.StatusRequests()
	var rep idem.ResumeReport
	require.Eventually(t, func() bool {
		r, err := c.Resume(ctx) // the dead process's lease runs out within a second
		require.NoError(t, err)
		rep.Succeeded += r.Succeeded
		return rep.Succeeded == 1
	}, 10*time.Second, 50*time.Millisecond)
	assert.Greater(t, srv.StatusRequests(), statusRequests, "resume asked the status endpoint")
	assert.Equal(t, requests, srv.Requests(), "resume did not re-send the order")
	assert.Equal(t, 1, srv.TotalOrders())
	rec, err = j.Lookup(ctx, "default", "checkout/cart-5")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
	assert.Equal(t, "ord_1", orderID(t, rec.Response.Body))
}

// Two processes calling Do for the same operation on one journal: one
// order, and both get it.
func TestAcceptanceTwoProcessesOneOrder(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	srv.Inject(testserver.SlowHandler(500 * time.Millisecond))
	path := filepath.Join(t.TempDir(), "ops.db")
	openJournal(t, path).Close() // created once, so both children open an existing file
	var wg sync.WaitGroup
	outputs := make([][]byte, 2)
	for i := range outputs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := childCommand(t, "do-once", "IDEM_JOURNAL="+path, "IDEM_URL="+srv.URL,
				"IDEM_STATUS_URL="+srv.StatusURL, "IDEM_OP=checkout/cart-6").Output()
			assert.NoError(t, err)
			outputs[i] = out
		}()
	}
	wg.Wait()
	var answers []string
	for _, out := range outputs {
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if line != "started" {
				answers = append(answers, line)
			}
		}
	}
	require.Len(t, answers, 20)
	for _, a := range answers {
		assert.Equal(t, answers[0], a, "every caller in both processes gets the same order and key")
	}
	assert.True(t, strings.HasPrefix(answers[0], "ord_1 "), answers[0])
	assert.Equal(t, 1, srv.TotalOrders())
}

// 6. An unknown operation past the server's retention is expired, not
// re-sent; Reconcile settles it.
func TestAcceptancePastRetentionNeedsReconciliation(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	policy := fastRetry()
	policy.MaxStatusChecks = 2
	c, j := acceptanceClient(t, srv, func(c *idem.Config) {
		c.Retention = 300 * time.Millisecond
		c.Retry = policy
	})
	ctx := context.Background()
	srv.Inject(testserver.DropAfterCommit)
	srv.InjectStatusN(testserver.StatusDown, 2)
	_, err := c.Do(ctx, orderOp("checkout/cart-7", 1))
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	rec, err := j.Lookup(ctx, "default", "checkout/cart-7")
	require.NoError(t, err)
	require.Equal(t, idem.StateUnknown, rec.State)

	time.Sleep(time.Until(rec.ExpiresAt) + 50*time.Millisecond)
	requests, statusRequests := srv.Requests(), srv.StatusRequests()
	_, err = c.Do(ctx, orderOp("checkout/cart-7", 1))
	require.ErrorIs(t, err, idem.ErrNeedsReconciliation)
	assert.Contains(t, err.Error(), "Reconcile")
	assert.Equal(t, requests, srv.Requests(), "nothing re-sent past retention")
	assert.Equal(t, statusRequests, srv.StatusRequests(), "a not_found past retention could be a forgotten key: not even asked")
	rec, err = j.Get(ctx, rec.Key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateExpired, rec.State)
	assert.Contains(t, rec.LastError, "retention")

	require.NoError(t, c.Reconcile(ctx, rec.Key, idem.StateSucceeded, "matched ord_1 in the orders table"))
	rec, err = j.Get(ctx, rec.Key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
	assert.Equal(t, "matched ord_1 in the orders table", rec.Note)
	res, err := c.Do(ctx, orderOp("checkout/cart-7", 1))
	require.NoError(t, err, "a reconciled operation is settled")
	assert.Equal(t, idem.StateSucceeded, res.State)
	assert.Equal(t, requests, srv.Requests())
	assert.Equal(t, 1, srv.TotalOrders())

	err = c.Reconcile(ctx, rec.Key, idem.StateRejected, "changed my mind")
	assert.ErrorIs(t, err, idem.ErrIllegalTransition, "a settled operation is not reconciled again")
}

// 7. The status endpoint failing leaves the operation unknown and nothing is
// re-sent; once it answers, Resume settles the operation.
func TestAcceptanceStatusEndpointDown(t *testing.T) {
	t.Parallel()
	for _, fault := range []testserver.StatusFault{testserver.StatusDown, testserver.StatusGarbage, testserver.StatusHang} {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			srv := testserver.Start(t)
			policy := fastRetry()
			policy.MaxStatusChecks = 3
			c, j := acceptanceClient(t, srv, func(c *idem.Config) {
				c.Retry = policy
				// Only a hanging status endpoint needs a short
				// AttemptTimeout to cut its checks; the others answer.
				if fault == testserver.StatusHang {
					c.AttemptTimeout = 200 * time.Millisecond
				}
			})
			ctx := context.Background()
			srv.Inject(testserver.DropAfterCommit)
			srv.InjectStatusN(fault, 3)
			_, err := c.Do(ctx, orderOp("checkout/cart-8", 1))
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			assert.NotErrorIs(t, err, idem.ErrNotSent)
			assert.Equal(t, 1, srv.Requests(), "an unanswered status check is never read as not found")
			// A hanging check the client cut may reach the server's handler
			// after the call returned.
			require.Eventually(t, func() bool { return srv.StatusRequests() >= 3 }, 10*time.Second, time.Millisecond)
			assert.Equal(t, 3, srv.StatusRequests())
			rec, err := j.Lookup(ctx, "default", "checkout/cart-8")
			require.NoError(t, err)
			assert.Equal(t, idem.StateUnknown, rec.State)

			// The endpoint is back: the operation is settled from it, by a
			// client on the same journal whose status checks are not bound
			// by the 200 ms that cut hanging ones.
			require.NoError(t, c.Close())
			c, _ = acceptanceClient(t, srv, func(c *idem.Config) { c.Journal = j })
			res, err := c.Do(ctx, orderOp("checkout/cart-8", 1))
			require.NoError(t, err)
			assert.Equal(t, "ord_1", orderID(t, res.Body))
			assert.Equal(t, 1, srv.Requests())
			assert.Equal(t, 1, srv.TotalOrders())
		})
	}
}

// 8. The server is down at first: the operation stays pending; when the
// server is back, one send, one order.
func TestAcceptanceServerDownThenBack(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens: every dial is refused

	j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
	c, err := idem.New(idem.Config{Journal: j, BaseURL: "http://" + addr, Status: idem.StatusEndpoint("http://" + addr + "/idempotency"), Retry: fastRetry()})
	require.NoError(t, err)
	defer c.Close()
	ctx := context.Background()
	_, err = c.Do(ctx, orderOp("checkout/cart-9", 1))
	require.ErrorIs(t, err, idem.ErrNotSent)
	rec, err := j.Lookup(ctx, "default", "checkout/cart-9")
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, rec.State)

	srv := testserver.Start(t, testserver.WithAddr(addr))
	res, err := c.Do(ctx, orderOp("checkout/cart-9", 1))
	require.NoError(t, err)
	assert.Equal(t, rec.Key, res.Key, "the same key as the journaled intent")
	assert.Equal(t, 1, srv.Requests(), "one send")
	assert.Equal(t, 1, srv.TotalOrders())
	assert.Equal(t, 0, srv.StatusRequests(), "a pending operation is sent directly")
}

// Resume drives pending operations to a send and in_flight or unknown ones
// to a status check first, with bounded concurrency, and reports progress.
func TestAcceptanceResume(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	path := filepath.Join(t.TempDir(), "ops.db")
	j := openJournal(t, path)
	ctx := context.Background()
	policy := fastRetry()
	policy.MaxStatusChecks = 1

	first, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.StatusURL), Retry: policy,
		HTTPClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}})
	require.NoError(t, err)
	const pending, unknown = 12, 6
	for i := range pending {
		_, err := first.Begin(ctx, orderOp(fmt.Sprint("batch/pending-", i), 1))
		require.NoError(t, err)
	}
	// Each order is created, its answer lost, and the one status check
	// fails: the outcome stays unknown. The connection is cut after the
	// commit, not held past a short AttemptTimeout, which would also bound
	// the status check and could end the call before the server's commit;
	// each request has a connection of its own, so that the transport does
	// not re-send one whose connection was cut.
	srv.InjectN(testserver.DropAfterCommit, unknown)
	srv.InjectStatusN(testserver.StatusDown, unknown)
	for i := range unknown {
		_, err := first.Do(ctx, orderOp(fmt.Sprint("batch/unknown-", i), 1))
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	}
	require.NoError(t, first.Close())
	require.Equal(t, unknown, srv.TotalOrders())
	requests := srv.Requests()

	var progress []idem.ResumeReport
	var mu sync.Mutex
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.StatusURL),
		Retry: fastRetry(), ResumeConcurrency: 4,
		OnResumeProgress: func(r idem.ResumeReport) { mu.Lock(); progress = append(progress, r); mu.Unlock() }})
	require.NoError(t, err)
	defer c.Close()
	// The unknown operations were left due only after a backoff; make them
	// due now by waiting it out.
	time.Sleep(fastRetry().MaxBackoff * 2)
	rep, err := c.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, pending+unknown, rep.Claimed)
	assert.Equal(t, pending+unknown, rep.Succeeded)
	assert.Zero(t, rep.Remaining())
	assert.Equal(t, pending+unknown, srv.TotalOrders(), "one order per operation")
	assert.Equal(t, requests+pending, srv.Requests(), "pending ones were sent once; unknown ones were not re-sent")
	mu.Lock()
	assert.Len(t, progress, pending+unknown, "progress after each operation")
	mu.Unlock()

	rep, err = c.Resume(ctx)
	require.NoError(t, err)
	assert.Zero(t, rep.Claimed, "nothing left")
	for rec, err := range j.List(ctx, idem.Filter{}) {
		require.NoError(t, err)
		assert.Equal(t, idem.StateSucceeded, rec.State, rec.ID)
	}
}

// Resume makes one pass: an operation it cannot settle (the status endpoint
// is down) is due again later, and this same call does not claim it again.
func TestResumeMakesOnePassWhileTheStatusEndpointIsDown(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	policy := fastRetry()
	policy.MaxStatusChecks = 1
	c, _ := acceptanceClient(t, srv, func(c *idem.Config) {
		c.Retry = policy
		// Each request on a connection of its own: the transport does not
		// re-send one whose connection was cut.
		c.HTTPClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		// Fewer workers than operations: the first ones are due again
		// (after 5 ms) while the last ones still wait for a worker.
		c.ResumeConcurrency = 2
	})
	ctx := context.Background()
	const n = 12
	// The answers are lost by a cut connection, not held past a short
	// AttemptTimeout, which would also bound Resume's status checks.
	srv.InjectN(testserver.DropAfterCommit, n)
	srv.InjectStatusN(testserver.StatusDown, 1000)
	for i := range n {
		_, err := c.Do(ctx, orderOp(fmt.Sprint("batch/op-", i), 1))
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	}
	time.Sleep(2 * fastRetry().MaxBackoff) // their backoff has passed: they are due
	statusBefore := srv.StatusRequests()
	rep, err := c.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, n, rep.Claimed, "each operation is claimed once")
	assert.Equal(t, n, rep.Unknown)
	assert.Equal(t, n, srv.StatusRequests()-statusBefore, "one status check each, no more")
	assert.Equal(t, n, srv.Requests(), "nothing re-sent")
}
