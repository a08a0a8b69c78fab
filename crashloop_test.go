package idem_test

// The crash loop: the promise of the package, checked against SIGKILL at
// random moments, many times over.
//
// A client child process ("crashloop-client", this test binary run again)
// drives a stream of orders through idem against the orders service, which
// runs as another child process ("ordersd") on SQLite files. The parent
// SIGKILLs the client after a random time, log-uniform between 1 and 400 ms
// after it is ready, and starts another one on the same journal, over and
// over; in a fifth of the lives it also SIGKILLs the server at a random
// moment while the client runs, and restarts it at once on the same files
// and the same address. The server holds every request for a random 0–20 ms
// after claiming its key and again after committing the order, so that
// kills often land inside a request: before it is sent, while it is
// written, while the server holds it, after the order is committed but
// before the answer is read, while the outcome is journaled, and during
// Resume. A tenth of the lives are killed during start-up, before the child
// says it is ready (while it opens the journal). Right after each kill the
// parent looks at the records the dead life held leased: how many were
// in_flight, and of those how many the server had already committed, is the
// evidence that the kills hit the windows that matter.
//
// Each life is started ahead of time, while the life before it runs, and
// waits for a line on its stdin ("go N", or "final N" for the lives after
// the kills), so that the exec and the runtime's start-up, long under
// -race, cost no wall time. Once told to go, a life:
//
//  1. opens the journal and builds a client with a short lease (500 ms), so
//     that the next life takes over a dead life's operations quickly, and a
//     status checker that prints every status check;
//  2. runs Resume;
//  3. drives, 8 at a time, first the operations the journal holds unsettled
//     (those still leased by the life just killed once their lease lapses),
//     then new operations crash/op-N, N counting up from where the last life
//     stopped. It prints "take N" before it first calls Do for a new N, and
//     one line "ok <id> <order_id> <key>" for every definitive answer, with
//     one write to the unbuffered stdout before it goes on. An error that is
//     not definitive (outcome unknown, not sent) is retried with Do; any
//     other error is printed as "fail".
//
// The parent reads every complete line a life wrote before it died. The
// operations of the run are the records of the journal (an N that was
// taken but never journaled was never sent: no order may name it). The
// order body carries the operation's ID as its item, so that an order
// created under a key the journal does not hold for that operation (a new
// key minted on a retry) shows as a second order for the operation, or as an
// order for an ID the journal never held.
//
// After the kill budget, the parent runs client lives without kills ("final"
// mode: no new operations, Resume, drive the unsettled ones, then Do for
// every operation, which answers from the journal) until one has every
// operation succeeded, and checks:
//
//   - every journaled operation is succeeded (none expired: the retention is
//     24 h), with the order its journaled response names;
//   - the orders table has exactly one row per operation, under the key the
//     journal holds for it, and no row for anything else;
//   - every "ok" any life printed names an order that exists, belongs to
//     that operation and carries the key the journal holds for it, and all
//     the acknowledgements of one operation agree;
//   - no life reported a journal error or any other hard failure.
//
// The run prints its figures (see the end of TestCrashLoop). It takes the
// number of client kills from -crashloop.kills, else IDEM_CRASHLOOP_KILLS,
// else 200; the random choices come from IDEM_CRASHLOOP_SEED when set (the
// seed is printed either way; timing still differs between runs, so a seed
// names a schedule of kills, not an exact interleaving).
//
//	go test -run TestCrashLoop -v .                                   # 200 kills
//	IDEM_CRASHLOOP_KILLS=2000 go test -run TestCrashLoop -v -timeout 30m .

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

var crashLoopKillsFlag = flag.Int("crashloop.kills", 0,
	"client SIGKILLs TestCrashLoop makes (default: $IDEM_CRASHLOOP_KILLS, else 200)")

func init() {
	children["crashloop-client"] = childCrashLoopClient
}

// Tunables of the loop.
const (
	crashMinLife       = time.Millisecond       // shortest life after "ready"
	crashMaxLife       = 400 * time.Millisecond // longest life after "ready"
	crashStartupShare  = 0.10                   // lives killed during start-up
	crashStartupWindow = 20 * time.Millisecond  // … within this time of their start, at first
	crashServerShare   = 0.20                   // lives in which the server is killed too
	crashLease         = 500 * time.Millisecond
	crashWorkers       = 8
	crashFinalBudget   = 2 * time.Minute // for the lives without kills
)

// crashOwner is Config.Owner of the life with process id pid. The client
// adds "#" and a random suffix: the leases of that life are those whose
// owner starts with crashOwner(pid)+"#".
func crashOwner(pid int) string { return "crashloop/" + strconv.Itoa(pid) }

func crashOpID(n int) string { return "crash/op-" + strconv.Itoa(n) }

// crashOp is the order of operation id: its item is the ID, so that every
// row of the orders table names the operation it was created for.
func crashOp(id string) idem.Op {
	body, _ := json.Marshal(map[string]any{"item": id, "quantity": 1})
	return idem.Op{ID: id, URL: "/orders", Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
}

// ---------------------------------------------------------------------------
// The client child.

// crashOut writes whole lines to stdout, one write(2) each, so that a line
// is either entirely in the pipe or not at all when the process is killed
// (the parent drops a last line without its newline anyway).
type crashOut struct{ mu sync.Mutex }

func (o *crashOut) printf(format string, args ...any) {
	line := fmt.Sprintf(format, args...) + "\n"
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = os.Stdout.WriteString(line)
}

// printingStatus prints every status check and what it answered.
type printingStatus struct {
	next idem.StatusChecker
	out  *crashOut
}

func (s printingStatus) CheckStatus(ctx context.Context, q idem.StatusQuery) (idem.Status, error) {
	st, err := s.next.CheckStatus(ctx, q)
	if err != nil {
		s.out.printf("st %s error", q.Record.ID)
	} else {
		s.out.printf("st %s %s", q.Record.ID, st.State)
	}
	return st, err
}

// journalError reports an error of the journal itself inside a Do error,
// as opposed to an outcome that is merely not known yet.
func journalError(err error) bool {
	for _, e := range []error{idem.ErrLeaseLost, idem.ErrConflict, idem.ErrLeased, idem.ErrJournalClosed,
		idem.ErrNotFound, idem.ErrDuplicateKey, idem.ErrInvalidRecord, idem.ErrIllegalTransition,
		idem.ErrJournalCorrupt, idem.ErrDiskFull} {
		if errors.Is(err, e) {
			return true
		}
	}
	return strings.Contains(err.Error(), "journal: ")
}

func childCrashLoopClient() error {
	out := &crashOut{}
	// The parent starts each life ahead of time, so that the exec and the
	// runtime's start-up (long under -race) overlap the life before; the
	// life begins when the parent writes "go N" or "final N" on its stdin
	// (N: the first operation number no life took yet).
	var mode string
	var next int
	if _, err := fmt.Fscanln(os.Stdin, &mode, &next); err != nil || (mode != "go" && mode != "final") {
		return fmt.Errorf("reading the start line on stdin: %q %v", mode, err)
	}
	final := mode == "final"
	j, err := idem.OpenSQLite(os.Getenv("IDEM_JOURNAL"))
	if err != nil {
		return err
	}
	defer j.Close()
	base := os.Getenv("IDEM_URL")
	c, err := idem.New(idem.Config{
		Journal: j, BaseURL: base,
		Status: printingStatus{next: idem.StatusEndpoint(base + "/idempotency"), out: out},
		// Fast retries, and enough status checks to outlast a server
		// restart (a few hundred ms) within one call.
		Retry: idem.RetryPolicy{MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
			MaxRetryAfter: 50 * time.Millisecond, MaxAttempts: 5, MaxStatusChecks: 20, Budget: 10 * time.Second,
			RetryRatio: 1, MinRetriesPerSecond: 1000},
		AttemptTimeout: time.Second,
		LeaseDuration:  crashLease,
		// The parent tells this life's records by their lease owner.
		Owner: crashOwner(os.Getpid()),
		OnResumeProgress: func(r idem.ResumeReport) {
			out.printf("rp %d", r.Claimed)
		},
	})
	if err != nil {
		return err
	}
	defer c.Close()
	ctx := context.Background()
	if final {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, crashFinalBudget/2)
		defer cancel()
	}
	out.printf("ready")

	rep, err := c.Resume(ctx)
	if err != nil {
		out.printf("fail resume %v", err)
		return err
	}
	out.printf("resumed %d %d %d %d", rep.Claimed, rep.Succeeded, rep.Remaining(), rep.Failed)
	if rep.Failed > 0 {
		// A journal error or a lost lease, with no other live worker.
		out.printf("fail resume: %d operations could not be driven", rep.Failed)
	}

	// What the journal holds unsettled goes first: those whose lease has
	// lapsed at once, those still leased by the life just killed when it
	// lapses, so that no worker sits waiting on a lease while new work is
	// there to do.
	var (
		mu   sync.Mutex
		left []idem.Record
	)
	for rec, err := range j.List(ctx, idem.Filter{States: []idem.State{idem.StatePending, idem.StateInFlight, idem.StateUnknown}}) {
		if err != nil {
			out.printf("fail list %v", err)
			return err
		}
		left = append(left, rec)
	}
	slices.SortFunc(left, func(a, b idem.Record) int { return a.Lease.ExpiresAt.Compare(b.Lease.ExpiresAt) })
	take := func() (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		if len(left) > 0 && (final || !left[0].Lease.Held(time.Now())) {
			id := left[0].ID
			left = left[1:]
			return id, true
		}
		if final {
			return "", false
		}
		n := next
		next++
		out.printf("take %d", n) // before Do can journal it
		return crashOpID(n), true
	}

	var hard atomic.Int32
	drive := func(id string) {
		for {
			res, err := c.Do(ctx, crashOp(id))
			switch {
			case err == nil && res.State == idem.StateSucceeded:
				var o struct {
					OrderID string `json:"order_id"`
				}
				if json.Unmarshal(res.Body, &o) != nil || o.OrderID == "" || strings.ContainsAny(o.OrderID, " \n") {
					o.OrderID = "-" // no order in the answer: the parent flags it
				}
				out.printf("ok %s %s %s %t", id, o.OrderID, res.Key, res.Replayed)
				return
			case err == nil:
				out.printf("fail %s rejected with %d: %s", id, res.StatusCode, res.Body)
				hard.Add(1)
				return
			case ctx.Err() != nil:
				out.printf("fail %s %v", id, err)
				hard.Add(1)
				return
			case journalError(err):
				out.printf("fail %s journal: %v", id, err)
				hard.Add(1)
				return
			case errors.Is(err, idem.ErrOutcomeUnknown):
				out.printf("err %s unknown", id)
			case errors.Is(err, idem.ErrNotSent):
				out.printf("err %s not_sent", id)
			default:
				out.printf("fail %s %v", id, err)
				hard.Add(1)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	var wg sync.WaitGroup
	for range crashWorkers {
		wg.Go(func() {
			for {
				id, ok := take()
				if !ok {
					return
				}
				drive(id)
			}
		})
	}
	wg.Wait() // only in final mode: otherwise the parent kills us first

	// Final mode: every operation of the journal, answered from it.
	var all []string
	for rec, err := range j.List(ctx, idem.Filter{}) {
		if err != nil {
			out.printf("fail list %v", err)
			return err
		}
		all = append(all, rec.ID)
	}
	ids := make(chan string)
	for range crashWorkers {
		wg.Go(func() {
			for id := range ids {
				drive(id)
			}
		})
	}
	for _, id := range all {
		ids <- id
	}
	close(ids)
	wg.Wait()
	if n := hard.Load(); n > 0 {
		return fmt.Errorf("%d operations failed", n)
	}
	out.printf("done %d", len(all))
	return nil
}

// ---------------------------------------------------------------------------
// The parent.

// crashChild is one life of the client.
type crashChild struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	started time.Time     // when it was told to begin
	ready   chan struct{} // closed when the child printed "ready"
	eof     chan struct{} // closed when its stdout is drained
	once    sync.Once
	waitErr error

	mu      sync.Mutex
	lines   []string
	partial string // a last line cut by the kill
}

// spawnCrashChild starts a life, which waits for begin.
func spawnCrashChild(t *testing.T, env ...string) *crashChild {
	t.Helper()
	cmd := childCommand(t, "crashloop-client", env...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	ch := &crashChild{cmd: cmd, stdin: stdin, ready: make(chan struct{}), eof: make(chan struct{})}
	require.NoError(t, cmd.Start())
	go func() {
		defer close(ch.eof)
		r := bufio.NewReader(stdout)
		var readyOnce sync.Once
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				ch.mu.Lock()
				ch.partial = line
				ch.mu.Unlock()
				_, _ = io.Copy(io.Discard, r)
				return
			}
			line = strings.TrimSuffix(line, "\n")
			ch.mu.Lock()
			ch.lines = append(ch.lines, line)
			ch.mu.Unlock()
			if line == "ready" {
				readyOnce.Do(func() { close(ch.ready) })
			}
		}
	}()
	t.Cleanup(func() { ch.kill() })
	return ch
}

// begin lets the life start: line is "go N" or "final N".
func (ch *crashChild) begin(t *testing.T, line string) {
	t.Helper()
	ch.started = time.Now()
	_, err := io.WriteString(ch.stdin, line+"\n")
	require.NoError(t, err, "the life died before it began")
}

// kill SIGKILLs the child (if it still runs) and waits for it and its
// output.
func (ch *crashChild) kill() {
	ch.once.Do(func() {
		_ = ch.cmd.Process.Signal(syscall.SIGKILL)
		<-ch.eof
		ch.waitErr = ch.cmd.Wait()
	})
}

// wait waits for the child to exit by itself, or kills it at the deadline.
func (ch *crashChild) wait(deadline time.Time) (exited bool) {
	select {
	case <-ch.eof:
		exited = true
	case <-time.After(time.Until(deadline)):
	}
	ch.kill()
	return exited
}

func (ch *crashChild) output() []string {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return slices.Clone(ch.lines)
}

// crashAck is one "ok" line.
type crashAck struct {
	life           int
	id, order, key string
}

// crashTally gathers what the lives printed.
type crashTally struct {
	maxTaken     int // highest N a life took (-1: none)
	taken        int
	acks         []crashAck
	status       map[string]int // status checks by answer
	errs         map[string]int // non-definitive Do errors by kind
	fails        []string
	partial      int // lines cut by a kill
	resumes      int // Resume calls that returned
	resumeClaims int // operations those Resume calls took up
	resumeKilled int // lives killed while Resume was running
}

func (tl *crashTally) add(life int, ch *crashChild) (phase string) {
	lines := ch.output()
	phase = "start-up"
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "ready":
			phase = "resume"
		case "resumed":
			phase = "driving"
			tl.resumes++
			if len(f) > 1 {
				n, _ := strconv.Atoi(f[1])
				tl.resumeClaims += n
			}
		case "take":
			n, _ := strconv.Atoi(f[1])
			tl.maxTaken = max(tl.maxTaken, n)
			tl.taken++
		case "ok":
			if len(f) >= 4 {
				tl.acks = append(tl.acks, crashAck{life: life, id: f[1], order: f[2], key: f[3]})
			} else {
				tl.fails = append(tl.fails, fmt.Sprintf("life %d: malformed line %q", life, line))
			}
		case "st":
			tl.status[f[len(f)-1]]++
		case "err":
			tl.errs[f[len(f)-1]]++
		case "fail":
			tl.fails = append(tl.fails, fmt.Sprintf("life %d: %s", life, line))
		case "rp", "done":
		default:
			tl.fails = append(tl.fails, fmt.Sprintf("life %d: unexpected line %q", life, line))
		}
	}
	if phase == "resume" {
		tl.resumeKilled++
	}
	ch.mu.Lock()
	if ch.partial != "" {
		tl.partial++
	}
	ch.mu.Unlock()
	return phase
}

func crashLoopKills(t *testing.T) int {
	if *crashLoopKillsFlag > 0 {
		return *crashLoopKillsFlag
	}
	if v := os.Getenv("IDEM_CRASHLOOP_KILLS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "IDEM_CRASHLOOP_KILLS")
		return n
	}
	return 200
}

func crashLoopSeed(t *testing.T) uint64 {
	if v := os.Getenv("IDEM_CRASHLOOP_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "IDEM_CRASHLOOP_SEED")
		return n
	}
	return rand.Uint64() >> 1
}

// logUniform draws a duration whose logarithm is uniform in [lo, hi]: as
// many kills within the first few milliseconds as between 100 and 400 ms.
func logUniform(r *rand.Rand, lo, hi time.Duration) time.Duration {
	l, h := math.Log(float64(lo)), math.Log(float64(hi))
	return time.Duration(math.Exp(l + r.Float64()*(h-l)))
}

func sleepUntil(at time.Time) { time.Sleep(time.Until(at)) }

// crashKillSite is what the journal showed right after one client kill,
// counting the records whose lease the killed life held: the operations it
// was driving when it died.
type crashKillSite struct {
	phase                      string
	inFlight, unknown, pending int
	// committed counts the in_flight records whose order the server had
	// already committed when the parent looked, right after the kill: the
	// life died after the server committed and before it journaled the
	// outcome (its answer was in flight, or being read or journaled).
	committed int
	backlog   int // active records left by earlier lives
	// pendingApplied lists the pending records, the dead life's or older,
	// whose key has an order: pending says the server cannot have seen
	// the request (ErrNotSent: "certainly not applied").
	pendingApplied []string
}

func TestCrashLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("SIGKILLs client and server processes hundreds of times")
	}
	kills := crashLoopKills(t)
	require.Positive(t, kills, "the number of client kills")
	seed := crashLoopSeed(t)
	t.Logf("crash loop: %d client kills, seed %d (IDEM_CRASHLOOP_SEED=%d to repeat the schedule)", kills, seed, seed)
	rnd := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
	began := time.Now()
	ctx := context.Background()

	dir := t.TempDir()
	jpath := filepath.Join(dir, "ops.db")
	j := openJournal(t, jpath) // created here, so that every life opens an existing file
	serverFlags := []string{"-lock-timeout", "300ms", "-jitter-before", "20ms", "-jitter-after", "20ms",
		"-seed", strconv.FormatUint(seed|1, 10)}
	srv := startServerProcess(t, dir, "127.0.0.1:0", serverFlags...)
	u, err := url.Parse(srv.url)
	require.NoError(t, err)
	ordersPath := filepath.Join(dir, "orders.db")
	orders, err := sql.Open("sqlite3", "file:"+ordersPath+"?_query_only=1&_busy_timeout=10000")
	require.NoError(t, err)
	defer orders.Close()
	spawn := func() *crashChild { return spawnCrashChild(t, "IDEM_JOURNAL="+jpath, "IDEM_URL="+srv.url) }
	settled := func() int {
		counts, err := j.Count(ctx)
		require.NoError(t, err)
		n := 0
		for _, c := range counts {
			if c.State.Terminal() {
				n += c.N
			}
		}
		return n
	}

	tally := &crashTally{maxTaken: -1, status: map[string]int{}, errs: map[string]int{}}
	var (
		sites          []crashKillSite
		perLife        []int
		serverKills    int
		startupKills   int
		exitedEarly    int
		readyWait      time.Duration
		readyLives     int
		alive, reap    time.Duration // lives after ready; kill, wait and inspection
		serverRestarts time.Duration
	)
	life := 0
	spare := spawn()
	for clientKills := 0; clientKills < kills; life++ {
		before := settled()
		ch := spare
		ch.begin(t, fmt.Sprintf("go %d", tally.maxTaken+1))
		spare = spawn() // boots while this life runs
		var at time.Time
		if rnd.Float64() < crashStartupShare {
			// Killed while it starts: opening the journal, building
			// the client. The window is twice the mean start-up so far.
			window := crashStartupWindow
			if readyLives > 0 {
				window = 2 * readyWait / time.Duration(readyLives)
			}
			at = ch.started.Add(time.Duration(rnd.Int64N(int64(max(window, time.Millisecond)))))
			startupKills++
		} else {
			select {
			case <-ch.ready:
			case <-ch.eof:
			case <-time.After(30 * time.Second):
				t.Fatalf("life %d: the client did not get ready in 30 s", life)
			}
			readyWait += time.Since(ch.started)
			readyLives++
			at = time.Now().Add(logUniform(rnd, crashMinLife, crashMaxLife))
		}
		if rnd.Float64() < crashServerShare {
			// The server dies while this life runs, maybe mid-request,
			// and comes back on the same files and address.
			sleepUntil(time.Now().Add(time.Duration(rnd.Int64N(int64(max(time.Until(at), time.Millisecond))))))
			srv.kill()
			serverKills++
			t0 := time.Now()
			srv = startServerProcess(t, dir, u.Host, serverFlags...)
			serverRestarts += time.Since(t0)
		}
		sleepUntil(at)
		killAt := time.Now()
		alive += killAt.Sub(ch.started)
		died := false
		select {
		case <-ch.eof:
			died = true
		default:
		}
		ch.kill()
		if died {
			exitedEarly++
			tally.fails = append(tally.fails, fmt.Sprintf("life %d exited before its kill: %v (its stderr says why)", life, ch.waitErr))
		}
		clientKills++
		site := crashKillSite{phase: tally.add(life, ch)}
		owner := crashOwner(ch.cmd.Process.Pid) + "#"
		hasOrder := func(key string) bool {
			var n int
			require.NoError(t, orders.QueryRow(`SELECT count(*) FROM orders WHERE idem_key = ?`, key).Scan(&n))
			return n > 0
		}
		for rec, err := range j.List(ctx, idem.Filter{States: []idem.State{idem.StatePending, idem.StateInFlight, idem.StateUnknown}}) {
			require.NoError(t, err)
			if rec.State == idem.StatePending && hasOrder(rec.Key) {
				site.pendingApplied = append(site.pendingApplied, fmt.Sprintf("%s (key %s, %s)", rec.ID, rec.Key, rec.LastError))
			}
			if !strings.HasPrefix(rec.Lease.Owner, owner) {
				site.backlog++
				continue
			}
			switch rec.State {
			case idem.StatePending:
				site.pending++
			case idem.StateUnknown:
				site.unknown++
			case idem.StateInFlight:
				site.inFlight++
				if hasOrder(rec.Key) {
					site.committed++
				}
			}
		}
		sites = append(sites, site)
		perLife = append(perLife, settled()-before)
		reap += time.Since(killAt)
	}
	killPhase := time.Since(began)

	// No more kills: lives run until one has every operation succeeded.
	finalStart := time.Now()
	deadline := finalStart.Add(crashFinalBudget)
	finalLives := 0
	for done := false; !done; {
		require.True(t, time.Now().Before(deadline), "no life settled every operation within %s (seed %d)", crashFinalBudget, seed)
		ch := spare
		ch.begin(t, fmt.Sprintf("final %d", tally.maxTaken+1))
		spare = spawn()
		exited := ch.wait(deadline)
		tally.add(life, ch)
		life++
		finalLives++
		out := ch.output()
		done = exited && ch.waitErr == nil && len(out) > 0 && strings.HasPrefix(out[len(out)-1], "done ")
		if !done {
			t.Logf("final life %d did not finish (exited %t, %v); starting another", finalLives, exited, ch.waitErr)
		}
	}
	finalPhase := time.Since(finalStart)
	spare.kill()
	srv.kill()

	// What the journal holds.
	type opInfo struct {
		rec   idem.Record
		order string // from the journaled response
	}
	ops := map[string]*opInfo{}
	var (
		attempts, events, byStatus, resends, notSettled, expired int
		history                                                  []idem.Event
	)
	for rec, err := range j.List(ctx, idem.Filter{}) {
		require.NoError(t, err)
		info := &opInfo{rec: rec}
		ops[rec.ID] = info
		attempts += rec.Attempts
		switch rec.State {
		case idem.StateSucceeded:
			var o struct {
				OrderID string `json:"order_id"`
			}
			if rec.Response != nil && json.Unmarshal(rec.Response.Body, &o) == nil {
				info.order = o.OrderID
			}
		case idem.StateExpired:
			expired++
			notSettled++
		default:
			notSettled++
		}
		history, err = j.History(ctx, rec.Key)
		require.NoError(t, err)
		events += len(history)
		by, re := readHistory(history)
		byStatus += by
		resends += re
	}

	// What the server holds.
	rows, err := orders.Query(`SELECT id, tenant, idem_key, item FROM orders`)
	require.NoError(t, err)
	type orderRow struct{ id, tenant, key, item string }
	byOrder := map[string]orderRow{}
	byItem := map[string][]orderRow{}
	for rows.Next() {
		var id int64
		var r orderRow
		require.NoError(t, rows.Scan(&id, &r.tenant, &r.key, &r.item))
		r.id = "ord_" + strconv.FormatInt(id, 10)
		byOrder[r.id] = r
		byItem[r.item] = append(byItem[r.item], r)
	}
	require.NoError(t, rows.Err())
	require.NoError(t, rows.Close())

	var problems []string
	problem := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	duplicates, lost, ghosts, wrongKey := 0, 0, 0, 0
	for id, info := range ops {
		rs := byItem[id]
		switch {
		case len(rs) == 0:
			lost++
			problem("%s (key %s, %s): no order on the server", id, info.rec.Key, info.rec.State)
		case len(rs) > 1:
			duplicates++
			problem("%s (key %s): %d orders: %v", id, info.rec.Key, len(rs), rs)
		case rs[0].key != info.rec.Key:
			wrongKey++
			problem("%s: the journal holds key %s, the order %s was created under %s", id, info.rec.Key, rs[0].id, rs[0].key)
		}
		if info.rec.State != idem.StateSucceeded {
			problem("%s (key %s) ended %s: %s", id, info.rec.Key, info.rec.State, info.rec.LastError)
		} else if len(rs) == 1 && info.order != rs[0].id {
			problem("%s: the journal's response names order %q, the server has %s", id, info.order, rs[0].id)
		}
	}
	for item, rs := range byItem {
		if ops[item] == nil {
			ghosts += len(rs)
			problem("orders %v name %q, which the journal never held: sent without a journaled intent", rs, item)
		}
	}
	ackedOps := map[string]crashAck{}
	badAcks := 0
	for _, a := range tally.acks {
		r, ok := byOrder[a.order]
		info := ops[a.id]
		switch {
		case !ok:
			badAcks++
			problem("life %d acknowledged %s as order %q, which the server does not have", a.life, a.id, a.order)
		case r.item != a.id || r.key != a.key:
			badAcks++
			problem("life %d acknowledged %s as order %s (key %s), which belongs to %s (key %s)", a.life, a.id, a.order, a.key, r.item, r.key)
		case info == nil || info.rec.Key != a.key:
			badAcks++
			problem("life %d acknowledged %s with key %s, which is not the journal's", a.life, a.id, a.key)
		}
		if prev, ok := ackedOps[a.id]; ok && (prev.order != a.order || prev.key != a.key) {
			badAcks++
			problem("%s acknowledged as %s/%s by life %d and as %s/%s by life %d", a.id, prev.order, prev.key, prev.life, a.order, a.key, a.life)
		}
		ackedOps[a.id] = a
	}
	for _, f := range tally.fails {
		problem("%s", f)
	}
	pendingApplied := map[string]bool{}
	for i, s := range sites {
		for _, p := range s.pendingApplied {
			if !pendingApplied[p] {
				pendingApplied[p] = true
				problem("after kill %d: journaled pending (not sent) although the server has its order: %s", i+1, p)
			}
		}
	}

	// The figures.
	phases := map[string]int{}
	var hitInFlight, hitCommitted, inFlight, committed, unknownAt, pendingAt, backlog int
	for _, s := range sites {
		backlog += s.backlog
		if s.committed > 0 {
			hitCommitted++
		}
		phases[s.phase]++
		inFlight += s.inFlight
		committed += s.committed
		unknownAt += s.unknown
		pendingAt += s.pending
		if s.inFlight > 0 {
			hitInFlight++
		}
	}
	slices.Sort(perLife)
	sum, zero := 0, 0
	for _, n := range perLife {
		sum += n
		if n == 0 {
			zero++
		}
	}
	pct := func(p float64) int { return perLife[min(len(perLife)-1, int(p*float64(len(perLife))))] }
	statusChecks := 0
	for _, n := range tally.status {
		statusChecks += n
	}
	orderCount := len(byOrder)
	t.Logf("crash loop figures (seed %d):", seed)
	t.Logf("  client kills       %d (start-up %d, during Resume %d, driving %d); lives %d (+%d without kills); exited before the kill %d",
		len(sites), phases["start-up"], phases["resume"], phases["driving"], len(sites), finalLives, exitedEarly)
	t.Logf("                     a life takes %s on average from its start to ready (journal open, client built), lives %s from its start to the kill; reaping and inspecting a kill takes %s",
		avg(readyWait, readyLives), avg(alive, len(sites)), avg(reap, len(sites)))
	t.Logf("  server kills       %d (restart %s on average)", serverKills, avg(serverRestarts, serverKills))
	t.Logf("  kills that hit     %d lives killed with requests in flight (%d records in_flight under the killed life's lease in all),",
		hitInFlight, inFlight)
	t.Logf("                     %d of them killed after the server committed an order and before its outcome was journaled (%d records);",
		hitCommitted, committed)
	t.Logf("                     held by the killed lives besides: %d unknown, %d pending; left by earlier lives: %.1f active records per kill",
		unknownAt, pendingAt, float64(backlog)/float64(len(sites)))
	t.Logf("  operations         %d journaled (%d numbers taken, up to %d); %d not succeeded (%d expired)",
		len(ops), tally.taken, tally.maxTaken, notSettled, expired)
	t.Logf("  orders             %d; duplicates %d, lost %d, under another key %d, for no journaled operation %d; pending although applied %d",
		orderCount, duplicates, lost, wrongKey, ghosts, len(pendingApplied))
	t.Logf("  settled per life   mean %.1f, median %d, p90 %d, max %d; %d lives settled none",
		float64(sum)/float64(len(perLife)), pct(0.5), pct(0.9), perLife[len(perLife)-1], zero)
	t.Logf("  acknowledgements   %d lines for %d operations, %d wrong; %d lines cut by kills",
		len(tally.acks), len(ackedOps), badAcks, tally.partial)
	t.Logf("  journal            %d attempts, %d events; %d operations settled by a status check, %d re-sends after not_found",
		attempts, events, byStatus, resends)
	t.Logf("  status checks      %d printed by the lives: %v", statusChecks, tally.status)
	t.Logf("  Do not definitive  %v (retried)", tally.errs)
	t.Logf("  Resume             %d returned, %d operations taken up; %d lives killed inside Resume",
		tally.resumes, tally.resumeClaims, tally.resumeKilled)
	t.Logf("  wall time          %s (kills %s, final %s)", time.Since(began).Round(time.Millisecond),
		killPhase.Round(time.Millisecond), finalPhase.Round(time.Millisecond))

	if n := len(problems); n > 0 {
		if n > 30 {
			problems = append(problems[:30], fmt.Sprintf("… and %d more", n-30))
		}
		t.Errorf("the promise is broken (seed %d), %d problems:\n  %s", seed, n, strings.Join(problems, "\n  "))
	}
	assert.Equal(t, len(ops), orderCount, "one order per operation (seed %d)", seed)
	assert.Zero(t, notSettled, "every operation settled (seed %d)", seed)
	assert.Len(t, ackedOps, len(ops), "the final life acknowledged every operation (seed %d)", seed)
	assert.Equal(t, kills, len(sites))
}

// readHistory tells from one operation's history whether it was settled by
// a status check (the event that settled it comes from unknown, or from an
// in_flight written by another owner, i.e. a life that died: no send of
// the settling owner came in between) and how many times it was re-sent
// after a status check said not_found (in_flight again from unknown or from
// another owner's in_flight).
func readHistory(h []idem.Event) (byStatus, resends int) {
	for i := 1; i < len(h); i++ {
		prev, e := h[i-1], h[i]
		fromOther := prev.Owner != e.Owner
		switch {
		case e.To.Terminal() && (e.From == idem.StateUnknown || (e.From == idem.StateInFlight && fromOther)):
			byStatus++
		case e.To == idem.StateInFlight && (e.From == idem.StateUnknown || (e.From == idem.StateInFlight && fromOther)):
			resends++
		}
	}
	return byStatus, resends
}

func avg(total time.Duration, n int) time.Duration {
	if n == 0 {
		return 0
	}
	return (total / time.Duration(n)).Round(time.Millisecond)
}
