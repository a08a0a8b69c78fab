package idem_test

// The promise under faults: thousands of distinct operations driven at once
// through a proxy that drops, resets, delays and refuses a share of the
// requests and status checks, against the orders service on SQLite. Every
// operation must end succeeded, with exactly one order, under its own key,
// and the journal must say so.

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/faultproxy"
	"github.com/idemkit/idem/internal/testserver"
)

var (
	faultsOps = flag.Int("faults.ops", 0,
		"operations of TestThousandsOfOperationsThroughFaults (0: $IDEM_FAULTS_OPS, else 2000, or 500 with -short)")
	faultsSeed = flag.Int64("faults.seed", 0,
		"seed of TestThousandsOfOperationsThroughFaults's fault proxy (0: $IDEM_FAULTS_SEED, else 1)")
)

// faultsConfig is how TestThousandsOfOperationsThroughFaults runs; its
// figures are printed with the results.
type faultsConfig struct {
	ops, workers int
	seed         int64
	// rates and statusRates total 30% of requests and 30% of status
	// requests.
	rates, statusRates map[faultproxy.Fault]float64
	attemptTimeout     time.Duration // the client's per attempt and status check
	hold               time.Duration // the proxy's Delay: longer than attemptTimeout
	policy             idem.RetryPolicy
	settleRounds       int           // Resume + Do rounds after the first pass
	settleBudget       time.Duration // and their total time
}

func newFaultsConfig(t *testing.T) faultsConfig {
	t.Helper()
	cfg := faultsConfig{
		ops:     2_000,
		workers: 64,
		seed:    1,
		rates: map[faultproxy.Fault]float64{
			faultproxy.DropResponse:  0.05,
			faultproxy.ResetRequest:  0.04,
			faultproxy.ResetResponse: 0.05,
			faultproxy.Delay:         0.04,
			faultproxy.Answer5xx:     0.04,
			faultproxy.Answer429:     0.04,
			faultproxy.Answer503:     0.04,
		},
		statusRates: map[faultproxy.Fault]float64{
			faultproxy.StatusFail: 0.20,
			faultproxy.StatusHang: 0.10,
		},
		attemptTimeout: 300 * time.Millisecond,
		hold:           2 * time.Second,
		policy: idem.RetryPolicy{
			MaxAttempts: 5,
			MinBackoff:  2 * time.Millisecond,
			MaxBackoff:  20 * time.Millisecond,
			// The proxy's Retry-After: 1 is longer: such a call returns with
			// its operation due a second later, never sooner, and the settle
			// rounds (Resume) finish it.
			MaxRetryAfter:   20 * time.Millisecond,
			Budget:          30 * time.Second,
			MaxStatusChecks: 8,
			// The shared retry budget exists to keep a failing server from
			// being hammered: by default a re-send is allowed for one in five
			// first attempts (plus 10 a second). Here a third of all requests
			// fail by design and an operation often needs several re-sends,
			// so the default budget would be spent within seconds, and every
			// later transient fault would end its Do early (ErrNotSent or
			// ErrOutcomeUnknown, left to Resume) instead of exercising the
			// retry path under test. These values make the budget unlimited
			// for this run: 10 tokens per first attempt, 100,000 a second.
			RetryRatio:          10,
			MinRetriesPerSecond: 100_000,
		},
		settleRounds: 10,
		settleBudget: 2 * time.Minute,
	}
	switch {
	case *faultsOps > 0:
		cfg.ops = *faultsOps
	case os.Getenv("IDEM_FAULTS_OPS") != "":
		n, err := strconv.Atoi(os.Getenv("IDEM_FAULTS_OPS"))
		require.NoError(t, err, "IDEM_FAULTS_OPS")
		require.Positive(t, n, "IDEM_FAULTS_OPS")
		cfg.ops = n
	case testing.Short():
		cfg.ops = 500
	}
	switch {
	case *faultsSeed != 0:
		cfg.seed = *faultsSeed
	case os.Getenv("IDEM_FAULTS_SEED") != "":
		n, err := strconv.ParseInt(os.Getenv("IDEM_FAULTS_SEED"), 10, 64)
		require.NoError(t, err, "IDEM_FAULTS_SEED")
		cfg.seed = n
	}
	return cfg
}

// raceEnabled reports whether this test binary was built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// startFaultProxy starts a faultproxy in front of target, closed at the
// test's end.
func startFaultProxy(t *testing.T, target string, cfg faultproxy.Config) *faultproxy.Proxy {
	t.Helper()
	proxy, err := faultproxy.New(target, cfg)
	require.NoError(t, err)
	require.NoError(t, proxy.Start())
	t.Cleanup(func() { _ = proxy.Close() })
	return proxy
}

// holdFirstWrite puts a gateway in front of target that loses the first
// write's answer by cutting its client's connection, and forwards that
// write to target only once release is called: it reaches the server after
// its client gave up on it, as one queued in a gateway does, at the point
// of the test's choosing rather than after a delay that must outlast
// whatever the client does meanwhile. Other requests pass untouched.
// arrived is closed when target has answered the held write.
func holdFirstWrite(t *testing.T, target string) (url string, release func(), arrived <-chan struct{}) {
	t.Helper()
	up, err := neturl.Parse(target)
	require.NoError(t, err)
	pass := httputil.NewSingleHostReverseProxy(up)
	pass.FlushInterval = -1 // an answer cut mid-body reaches the client cut, not withheld
	var writes atomic.Int32
	held := make(chan *http.Request, 1)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || writes.Add(1) > 1 {
			pass.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
			return
		}
		late, err := http.NewRequest(r.Method, target+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			t.Error(err)
			return
		}
		late.Header = r.Header.Clone()
		held <- late
		dropConn(w)
	}))
	t.Cleanup(gw.Close)
	done := make(chan struct{})
	var once sync.Once
	var released atomic.Bool
	release = func() {
		once.Do(func() {
			released.Store(true)
			go func() {
				defer close(done)
				resp, err := http.DefaultClient.Do(<-held)
				if err != nil {
					t.Errorf("the held write: %v", err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}()
		})
	}
	t.Cleanup(func() {
		if released.Load() {
			<-done
		}
	})
	return gw.URL, release, done
}

// startFaultsOrders runs the orders service (testserver.Daemon: the
// middleware with its SQLite key store, over the orders table with its
// UNIQUE (tenant, key) constraint) in this process, on files under dir. stop
// shuts it down and waits until its databases are closed.
func startFaultsOrders(t *testing.T, dir string) (url string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := testserver.Daemon(ctx, []string{"-addr", "127.0.0.1:0",
			"-store", filepath.Join(dir, "keys.db"), "-orders", filepath.Join(dir, "orders.db")}, pw)
		pw.CloseWithError(cmpNil(err, io.EOF))
		done <- err
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		cancel()
		t.Fatalf("the orders service did not start: %v (%v)", err, <-done)
	}
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	require.True(t, ok, "the orders service said %q", line)
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			assert.NoError(t, <-done, "the orders service stopped with an error")
		})
	}
	t.Cleanup(stop)
	return url, stop
}

func cmpNil(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}

// faultsOrder is a row of the orders table.
type faultsOrder struct {
	id, tenant, item string
	quantity         int
}

// readFaultsOrders reads the whole orders table, by idempotency key, and
// the number of rows.
func readFaultsOrders(t *testing.T, path string) (map[string]faultsOrder, int) {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	rows, err := db.Query(`SELECT id, tenant, idem_key, item, quantity FROM orders`)
	require.NoError(t, err)
	defer rows.Close()
	byKey := map[string]faultsOrder{}
	n := 0
	for rows.Next() {
		var (
			id  int64
			key string
			o   faultsOrder
		)
		require.NoError(t, rows.Scan(&id, &o.tenant, &key, &o.item, &o.quantity))
		o.id = "ord_" + strconv.FormatInt(id, 10)
		_, dup := byKey[key]
		assert.False(t, dup, "two orders carry key %s (the UNIQUE constraint failed)", key)
		byKey[key] = o
		n++
	}
	require.NoError(t, rows.Err())
	return byKey, n
}

func faultsOpID(i int) string { return fmt.Sprint("load/op-", i) }

// Each operation orders a quantity derived from its index, so that the
// order under an operation's key shows it was made for that operation.
func faultsQuantity(i int) int { return i%1000 + 1 }

// TestThousandsOfOperationsThroughFaults drives 2,000 distinct operations
// (-faults.ops N or $IDEM_FAULTS_OPS to change it; 500 with -short) from
// 64 goroutines through a fault proxy that spoils 30% of the
// requests (dropped or reset after the server committed, reset before it
// saw anything, held past the client's timeout, answered 500, 429 or 503 by
// the proxy) and 30% of the status checks (500, or no answer), against the
// orders service with a SQLite key store and a SQLite journal. Operations
// that Do leaves unsettled are driven with Resume and Do until every one is
// settled, within a bounded number of rounds and time. Then:
//
//   - every operation succeeded with 201 and an order ID, and the journal
//     holds every operation as succeeded with that answer (nothing lost);
//   - the orders table has exactly one row per operation, under the key the
//     client journaled for it, with that operation's quantity, and each
//     result names its own row (no duplicate, no answer from another
//     operation).
//
// The seed (-faults.seed or $IDEM_FAULTS_SEED, default 1) fixes the
// sequence of faults the proxy draws; which request draws which fault still
// depends on the scheduler.
//
// The README's test command runs the default, 2,000 operations, to stay
// within its time; .ci/run runs 10,000 under -race as a step of its own
// (about 100 s on two cores). The flags only exist in this package's test
// binary: go test -run TestThousands . -faults.ops 50000.
func TestThousandsOfOperationsThroughFaults(t *testing.T) {
	// Mostly waiting (on the proxy's held answers, timeouts and back-offs):
	// it runs beside the other parallel tests instead of before them.
	t.Parallel()
	cfg := newFaultsConfig(t)
	race := raceEnabled()
	t.Logf("%d operations from %d goroutines, seed %d, race detector %v", cfg.ops, cfg.workers, cfg.seed, race)
	start := time.Now()
	ctx := context.Background()
	dir := t.TempDir()

	serverURL, stopServer := startFaultsOrders(t, dir)
	proxy := startFaultProxy(t, serverURL, faultproxy.Config{Rates: cfg.rates, StatusRates: cfg.statusRates,
		Seed: cfg.seed, Delay: cfg.hold})

	var toUnknown, toPending atomic.Int64
	j := openJournal(t, filepath.Join(dir, "ops.db"))
	c, err := idem.New(idem.Config{
		Journal:           j,
		BaseURL:           proxy.URL,
		Status:            idem.StatusEndpoint(proxy.URL + "/idempotency"),
		AttemptTimeout:    cfg.attemptTimeout,
		Retry:             cfg.policy,
		ResumeConcurrency: cfg.workers,
		OnTransition: func(tr idem.Transition) {
			switch tr.To {
			case idem.StateUnknown:
				toUnknown.Add(1)
			case idem.StatePending:
				toPending.Add(1)
			}
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })

	// ErrNotSent promises that the request certainly did not take effect:
	// every time Do says so, ask the server itself (not through the proxy)
	// whether it holds the key. It must not, unless the client took a
	// refusal for the whole story: a refused re-send that net/http made on
	// its own after the first write was committed
	// (TestFaultsHiddenResendThenRefusedIsNotNotSent), or a refused re-send
	// after a status check said not_found while an earlier attempt was
	// still on its way (TestFaultsLateArrivalAfterNotFoundIsNotNotSent; an
	// attempt that arrives after this check escapes it).
	direct := &http.Client{Timeout: 10 * time.Second}
	t.Cleanup(direct.CloseIdleConnections)
	var notSentButApplied atomic.Int64
	checkNotSent := func(i int, err error) {
		var oe *idem.OperationError
		if !errors.As(err, &oe) {
			t.Errorf("%s: ErrNotSent without an *OperationError: %v", faultsOpID(i), err)
			return
		}
		resp, gerr := direct.Get(serverURL + "/idempotency/" + oe.Key)
		if gerr != nil {
			t.Errorf("%s: asking the server about key %s: %v", faultsOpID(i), oe.Key, gerr)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			notSentButApplied.Add(1)
			t.Errorf("%s: Do returned ErrNotSent (%v) but the server holds key %s: HTTP %d %s",
				faultsOpID(i), err, oe.Key, resp.StatusCode, body)
		}
	}

	// The first pass: every operation's Do, 64 at a time.
	results := make([]*idem.Result, cfg.ops)
	lastErr := make([]error, cfg.ops)
	var firstUnknown, firstNotSent, firstOther atomic.Int64
	var hard sync.Map // index → an error no retry can cure
	doAll := func(ctx context.Context, todo []int, first bool) {
		next := make(chan int)
		var wg sync.WaitGroup
		for range cfg.workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					res, err := c.Do(ctx, orderOp(faultsOpID(i), faultsQuantity(i)))
					lastErr[i] = err
					switch {
					case err == nil:
						results[i] = res
					case errors.Is(err, idem.ErrOutcomeUnknown):
						if first {
							firstUnknown.Add(1)
						}
					case errors.Is(err, idem.ErrNotSent):
						if first {
							firstNotSent.Add(1)
						}
						checkNotSent(i, err)
					default:
						// ErrKeyConflict, ErrNeedsReconciliation,
						// ErrFingerprintMismatch, a journal error: none of
						// them may come from these faults.
						if first {
							firstOther.Add(1)
						}
						hard.Store(i, err)
					}
				}
			}()
		}
		for _, i := range todo {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	all := make([]int, cfg.ops)
	for i := range all {
		all[i] = i
	}
	doAll(ctx, all, true)
	firstPass := time.Since(start)
	firstSettled := cfg.ops - int(firstUnknown.Load()+firstNotSent.Load()+firstOther.Load())

	// Drive what is left: Resume takes up every due operation the journal
	// holds unsettled, then Do collects each result (from the journal when
	// Resume settled it). Bounded: every operation terminal is an
	// assertion.
	unsettled := func() []int {
		var left []int
		for i, r := range results {
			if r == nil {
				left = append(left, i)
			}
		}
		return left
	}
	rounds := 0
	var resumed idem.ResumeReport
	settleDeadline := time.Now().Add(cfg.settleBudget)
	for left := unsettled(); len(left) > 0; left = unsettled() {
		if rounds == cfg.settleRounds || time.Now().After(settleDeadline) {
			t.Logf("settling stopped after %d rounds, %s: %d operations unsettled",
				rounds, time.Since(start).Round(time.Millisecond), len(left))
			break
		}
		rounds++
		// Operations left unsettled are due again after MaxBackoff.
		time.Sleep(2 * cfg.policy.MaxBackoff)
		// Resume returns when no operation is due, but one it leaves
		// unsettled is due again after MaxBackoff, and Resume takes it up
		// again in the same call: while the faults last it may not return
		// by itself. Each round gets a slice of the budget; what is left
		// unsettled is the assertion below.
		rctx, cancel := context.WithTimeout(ctx, min(30*time.Second, time.Until(settleDeadline)))
		rep, err := c.Resume(rctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			require.NoError(t, err, "Resume, round %d", rounds)
		}
		resumed.Claimed += rep.Claimed
		resumed.Succeeded += rep.Succeeded
		resumed.Rejected += rep.Rejected
		resumed.Failed += rep.Failed
		t.Logf("settle round %d: %d operations unsettled; Resume claimed %d, succeeded %d, rejected %d, pending %d, unknown %d, expired %d, failed %d (%v)",
			rounds, len(left), rep.Claimed, rep.Succeeded, rep.Rejected, rep.Pending, rep.Unknown, rep.Expired, rep.Failed, err)
		dctx, cancel := context.WithDeadline(ctx, settleDeadline)
		doAll(dctx, left, false)
		cancel()
	}
	settled := time.Since(start)

	// Every operation terminal, or the test says which are not and why.
	hard.Range(func(k, v any) bool {
		t.Errorf("operation %s: a hard error: %v", faultsOpID(k.(int)), v)
		return true
	})
	if left := unsettled(); len(left) > 0 {
		for _, i := range left[:min(len(left), 20)] {
			rec, err := j.Lookup(ctx, "default", faultsOpID(i))
			t.Errorf("operation %s never settled: Do: %v; journal: %s after %d attempts, last error %q (lookup error %v)",
				faultsOpID(i), lastErr[i], rec.State, rec.Attempts, rec.LastError, err)
		}
		t.Fatalf("%d of %d operations never settled after %d rounds in %s (seed %d)",
			len(left), cfg.ops, rounds, settled.Round(time.Millisecond), cfg.seed)
	}

	require.NoError(t, c.Close())
	stats := proxy.Stats()
	require.NoError(t, proxy.Close())
	stopServer() // the orders database is closed: read it as it is on disk

	// The results: every operation succeeded with its own order.
	byID := map[string]int{}
	keys := map[string]int{}
	replayed := 0
	for i, res := range results {
		require.Equal(t, idem.StateSucceeded, res.State, "%s: rejected with %d %s", faultsOpID(i), res.StatusCode, res.Body)
		require.Equal(t, 201, res.StatusCode, faultsOpID(i))
		id := orderID(t, res.Body)
		if other, dup := byID[id]; dup {
			t.Errorf("%s and %s both got order %s", faultsOpID(other), faultsOpID(i), id)
		}
		byID[id] = i
		if other, dup := keys[res.Key]; dup {
			t.Errorf("%s and %s share key %s", faultsOpID(other), faultsOpID(i), res.Key)
		}
		keys[res.Key] = i
		if res.Replayed {
			replayed++
		}
	}

	// The journal: every operation, succeeded, with the answer Do gave.
	attempts, journaled := 0, 0
	var maxAttempts int
	for rec, err := range j.List(ctx, idem.Filter{}) {
		require.NoError(t, err)
		journaled++
		i, ok := keys[rec.Key]
		if !assert.True(t, ok, "the journal holds %s/%s (key %s), which no result names", rec.Scope, rec.ID, rec.Key) {
			continue
		}
		assert.Equal(t, faultsOpID(i), rec.ID)
		assert.Equal(t, idem.StateSucceeded, rec.State, rec.ID)
		if assert.NotNil(t, rec.Response, rec.ID) {
			assert.Equal(t, results[i].Body, rec.Response.Body, "%s: the journal holds the answer Do returned", rec.ID)
		}
		attempts += rec.Attempts
		maxAttempts = max(maxAttempts, rec.Attempts)
	}
	assert.Equal(t, cfg.ops, journaled, "one journal record per operation")

	// The server: exactly one order per operation, under its key, for its
	// quantity, and it is the order the result names.
	orders, rows := readFaultsOrders(t, filepath.Join(dir, "orders.db"))
	assert.Equal(t, cfg.ops, rows, "orders on the server == operations (a duplicate or a lost order otherwise)")
	for key, i := range keys {
		o, ok := orders[key]
		if !assert.True(t, ok, "%s (key %s) succeeded but no order carries its key", faultsOpID(i), key) {
			continue
		}
		assert.Equal(t, orderID(t, results[i].Body), o.id, "%s: the result names the order made under its key", faultsOpID(i))
		assert.Equal(t, faultsQuantity(i), o.quantity, "%s: the order under its key is for its request", faultsOpID(i))
		assert.Equal(t, "default", o.tenant)
	}

	faults := make([]string, 0, len(cfg.rates)+len(cfg.statusRates))
	for _, f := range slices.Concat(faultproxy.RequestFaults(), faultproxy.StatusFaults()) {
		if cfg.rates[f] == 0 && cfg.statusRates[f] == 0 {
			continue
		}
		assert.Positive(t, stats.Faults[f], "the proxy injected %s", f)
		faults = append(faults, fmt.Sprintf("%s=%d", f, stats.Faults[f]))
	}
	t.Logf("wall time %s (first pass %s, %d settle rounds), race detector %v, seed %d",
		settled.Round(time.Millisecond), firstPass.Round(time.Millisecond), rounds, race, cfg.seed)
	t.Logf("operations %d: first Do settled %d, unknown %d, not sent %d, other %d; Resume claimed %d (succeeded %d, failed %d); replayed answers %d",
		cfg.ops, firstSettled, firstUnknown.Load(), firstNotSent.Load(), firstOther.Load(),
		resumed.Claimed, resumed.Succeeded, resumed.Failed, replayed)
	t.Logf("attempts journaled %d (%.3f per operation, max %d); transitions to unknown %d, back to pending %d",
		attempts, float64(attempts)/float64(cfg.ops), maxAttempts, toUnknown.Load(), toPending.Load())
	t.Logf("proxy: %d requests, %d status checks, %d forwarded, %d upstream errors; %d faults injected (%.1f%% of requests, %.1f%% of status checks)",
		stats.Requests, stats.StatusRequests, stats.Forwarded, stats.UpstreamErrors, stats.Injected(),
		100*float64(stats.Injected()-stats.Faults[faultproxy.StatusFail]-stats.Faults[faultproxy.StatusHang])/float64(max(stats.Requests, 1)),
		100*float64(stats.Faults[faultproxy.StatusFail]+stats.Faults[faultproxy.StatusHang])/float64(max(stats.StatusRequests, 1)))
	t.Logf("faults: %s", strings.Join(faults, " "))
	t.Logf("orders on the server %d, operations %d, distinct order IDs %d; ErrNotSent answers whose key the server held %d",
		rows, cfg.ops, len(byID), notSentButApplied.Load())
}

// Go's http.Transport re-sends a request that carries an Idempotency-Key
// when a reused keep-alive connection dies before any reply, without telling
// the caller (Request.isReplayable in net/http). Here the first, hidden
// write reaches the server, which commits the order before the proxy drops
// the connection; the re-send, and every attempt after it, is answered 429
// by the proxy. One of the writes was applied, so the operation must not
// come back as ErrNotSent ("it certainly was not applied"), nor be
// journaled pending, which Cancel would then withdraw although the server
// holds its order.
func TestFaultsHiddenResendThenRefusedIsNotNotSent(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	policy := fastRetry()
	policy.MaxAttempts = 5
	proxy := startFaultProxy(t, srv.URL, faultproxy.Config{RetryAfter: -1, Script: []faultproxy.Fault{
		faultproxy.Pass,                                                                        // warm-up: leaves a keep-alive connection in the client's pool
		faultproxy.DropResponse,                                                                // the hidden write on the reused connection: committed, then dropped
		faultproxy.Answer429,                                                                   // net/http's silent re-send on a new connection
		faultproxy.Answer429, faultproxy.Answer429, faultproxy.Answer429, faultproxy.Answer429, // attempts 2–5
	}})
	c, j := newClient(t, idem.Config{BaseURL: proxy.URL, Status: idem.StatusEndpoint(proxy.URL + "/idempotency"),
		Retry: policy, AttemptTimeout: 5 * time.Second})
	ctx := context.Background()

	warm, err := c.Do(ctx, orderOp("hidden/warm-up", 1))
	require.NoError(t, err)
	require.Equal(t, "ord_1", orderID(t, warm.Body))

	_, err = c.Do(ctx, orderOp("hidden/op", 1))
	rec, lerr := j.Lookup(ctx, "default", "hidden/op")
	require.NoError(t, lerr)
	// The scenario happened: the hidden write created the order, and
	// net/http re-sent the request once on its own.
	require.Equal(t, 2, srv.TotalOrders(), "the dropped write committed the operation's order")
	require.Equal(t, 7, proxy.Stats().Requests, "1 warm-up + 1 hidden write + 5 attempts")
	allSame(t, srv.KeysSeen()[1:], rec.Key)
	assert.Equal(t, 5, rec.Attempts, "the client's attempts: RetryPolicy.MaxAttempts")
	assert.Equal(t, 1, rec.TransportResends, "the transport's own re-send, counted apart")

	assert.NotErrorIs(t, err, idem.ErrNotSent, "an operation the server applied is reported as certainly not applied")
	assert.NotEqual(t, idem.StatePending, rec.State, "journaled pending (never sent) although the server holds its order; last error %q", rec.LastError)
	assert.False(t, rec.ExpiresAt.IsZero(), "the server has the key: its retention clock runs")
	cerr := c.Cancel(ctx, rec.Key)
	assert.ErrorIs(t, cerr, idem.ErrIllegalTransition, "Cancel withdrew an operation whose order exists")
	if cerr == nil {
		return // canceled: Do would report ErrCanceled for an order that exists
	}

	res, err := c.Do(ctx, orderOp("hidden/op", 1))
	require.NoError(t, err)
	assert.Equal(t, "ord_2", orderID(t, res.Body), "the order the hidden write created")
	assert.Equal(t, 2, srv.TotalOrders())
}

// A status check that says not_found tells what the server has seen so far,
// not what it will see: an earlier attempt held in a gateway (or delayed in
// the network) can still arrive after it. Here the first attempt's answer is
// lost and the attempt itself held by a gateway; the status check finds
// nothing, the re-send with the same key is refused with 429 until the
// attempts run out. Then the held attempt arrives and creates the order.
// The operation was written to the wire, so it must not come back as
// ErrNotSent, nor be journaled pending, which Cancel would then withdraw
// although the server executes it.
func TestFaultsLateArrivalAfterNotFoundIsNotNotSent(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	policy := fastRetry()
	policy.MaxAttempts = 3
	proxy := startFaultProxy(t, srv.URL, faultproxy.Config{RetryAfter: -1, Script: []faultproxy.Fault{
		faultproxy.Answer429, // after the status check said not_found: the re-send, attempt 2
		faultproxy.Answer429, // attempt 3
	}})
	// The attempt is held until Do has returned, not for a delay: the
	// client's default AttemptTimeout bounds its status check and re-sends,
	// which no machine's speed then reorders around the late arrival.
	gateway, release, arrived := holdFirstWrite(t, proxy.URL)
	c, j := newClient(t, idem.Config{BaseURL: gateway, Status: idem.StatusEndpoint(gateway + "/idempotency"), Retry: policy})
	ctx := context.Background()

	_, err := c.Do(ctx, orderOp("late/op", 1))
	rec, lerr := j.Lookup(ctx, "default", "late/op")
	require.NoError(t, lerr)
	// The scenario happened: the status check ran before the held attempt
	// arrived, and the order appears afterwards, under the operation's key.
	require.GreaterOrEqual(t, proxy.Stats().StatusRequests, 1)
	require.Equal(t, 2, proxy.Stats().Requests, "the 2 re-sends; the first attempt is still held")
	require.Zero(t, srv.TotalOrders())
	release()
	<-arrived
	require.Equal(t, 1, srv.TotalOrders(), "the held attempt reached the server")
	allSame(t, srv.KeysSeen(), rec.Key)

	assert.NotErrorIs(t, err, idem.ErrNotSent, "a written attempt was still on its way: not 'certainly not applied'")
	assert.NotEqual(t, idem.StatePending, rec.State, "journaled pending (never sent) although an attempt was on its way; last error %q", rec.LastError)
	cerr := c.Cancel(ctx, rec.Key)
	assert.ErrorIs(t, cerr, idem.ErrIllegalTransition, "Cancel withdrew an operation the server executed")
	if cerr == nil {
		return
	}
	res, err := c.Do(ctx, orderOp("late/op", 1))
	require.NoError(t, err)
	assert.Equal(t, "ord_1", orderID(t, res.Body))
	assert.Equal(t, 1, srv.TotalOrders())
}
