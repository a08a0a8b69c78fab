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
//     journal holds for it and in the operation's tenant, and no row for
//     anything else;
//   - every "ok" any life printed names an order that exists, belongs to
//     that operation and carries the key the journal holds for it, and all
//     the acknowledgements of one operation agree;
//   - no life reported a journal error or any other hard failure.
//
// TestCrashLoop runs the loop in two configurations. "default" is the one
// above: one tenant, the key in Idempotency-Key as a bare token, no
// credentials. "tenants" is issue 10's: the operations belong to two
// tenants (even numbers to tenant-a, odd ones to tenant-b, in X-Tenant),
// each with its own bearer token, and the server (ordersd -key-header
// X-Request-Key -key-quoted -tenant-tokens … -audit …) takes the key from
// X-Request-Key only, as an sf-string, refuses any request (order or
// status check) with the key in another header or form (400) or without
// its tenant's token (403), and writes one audit line per request. Each
// life is told on its start line how its clients are configured, drawn at
// random:
//
//   - its key form: "custom" (KeyHeader X-Request-Key, QuoteKey), or
//     "default" (neither): such a life creates no operation, and finishes
//     those the journal holds (Resume, then Do for each), every attempt and
//     status check in the form journaled with the record; the final lives
//     are of this form;
//   - its tenancy: "clients", one client per tenant (Config.Scope, Resume
//     of its own scope, and only its own token: for an operation of another
//     tenant it would send that), or "shared", one client for both
//     (Op.Scope, ResumeScopes, the token chosen by OperationFrom's scope).
//
// Authorize prints every request it sees, with the key's form on it; the
// status checker takes X-Tenant from the journaled request, so that the
// server compares the token (chosen by the operation's scope) with a
// tenant from another source. Besides the checks above: every record is
// journaled in its tenant's scope with the form X-Request-Key, quoted; the
// server's audit holds no request with the key in another header or form
// and none without its tenant's token, and it saw every operation; the
// lives sent every request with the key as X-Request-Key, quoted; and
// lives of the default form did send requests.
//
// The run prints its figures (see the end of runCrashLoop). It takes the
// number of client kills of each configuration from -crashloop.kills, else
// IDEM_CRASHLOOP_KILLS, else 200 for "default" and 100 for "tenants"; the
// random choices come from IDEM_CRASHLOOP_SEED when set (the seed is
// printed either way; timing still differs between runs, so a seed names a
// schedule of kills, not an exact interleaving).
//
//	go test -run TestCrashLoop -v .                                   # 200 and 100 kills
//	go test -run TestCrashLoop/tenants -v .                           # one configuration
//	IDEM_CRASHLOOP_KILLS=2000 go test -run TestCrashLoop -v -timeout 30m .

import (
	"bufio"
	"cmp"
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
	"client SIGKILLs each configuration of TestCrashLoop makes (default: $IDEM_CRASHLOOP_KILLS, else 200 and 100)")

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

// The tenants configuration: two tenants, each with its own token, and the
// key in a custom header, quoted.
const (
	crashKeyHeader    = "X-Request-Key"
	crashTenantHeader = "X-Tenant" // the orders service's (internal/orders.TenantHeader)
	// crashKeyForm is how every request of the tenants configuration must
	// carry its key, as the child's Authorize sees it.
	crashKeyForm = crashKeyHeader + ":quoted"
)

var crashTenants = [2]string{"tenant-a", "tenant-b"}

// A life of the tenants configuration is told on its start line how its
// clients are configured.
const (
	crashFormCustom  = "custom"  // KeyHeader X-Request-Key, QuoteKey: creates operations
	crashFormDefault = "default" // the default header and form: creates none, finishes the others
	crashOneClient   = "clients" // one client per tenant, Config.Scope, its own token only
	crashSharedScope = "shared"  // one client for both, Op.Scope, ResumeScopes, a token per OperationFrom
)

// crashOwner is Config.Owner of the life with process id pid. The client
// adds "#" and a random suffix: the leases of that life are those whose
// owner starts with crashOwner(pid)+"#".
func crashOwner(pid int) string { return "crashloop/" + strconv.Itoa(pid) }

func crashOpID(n int) string { return "crash/op-" + strconv.Itoa(n) }

// crashOpNumber is the N of crash/op-N, or -1.
func crashOpNumber(id string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(id, "crash/op-"))
	if err != nil || !strings.HasPrefix(id, "crash/op-") {
		return -1
	}
	return n
}

// crashTenantOf is the tenant of operation id in the tenants
// configuration: even numbers are tenant-a's, odd ones tenant-b's.
func crashTenantOf(id string) string {
	n := crashOpNumber(id)
	if n < 0 {
		return ""
	}
	return crashTenants[n%2]
}

// crashOp is the order of operation id: its item is the ID, so that every
// row of the orders table names the operation it was created for. With a
// tenant, the request carries it in X-Tenant, and scoped sets Op.Scope
// (otherwise the client's Config.Scope is the operation's).
func crashOp(id, tenant string, scoped bool) idem.Op {
	body, _ := json.Marshal(map[string]any{"item": id, "quantity": 1})
	op := idem.Op{ID: id, URL: "/orders", Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
	if tenant != "" {
		op.Header.Set(crashTenantHeader, tenant)
		if scoped {
			op.Scope = tenant
		}
	}
	return op
}

// crashTokens reads "tenant=token,tenant=token" (the server's
// -tenant-tokens).
func crashTokens(s string) map[string]string {
	if s == "" {
		return nil
	}
	m := map[string]string{}
	for pair := range strings.SplitSeq(s, ",") {
		tenant, token, _ := strings.Cut(pair, "=")
		m[tenant] = token
	}
	return m
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

// tenantStatus asks the status endpoint in the operation's tenant: the
// orders service scopes keys by X-Tenant, which the status request takes
// from the journaled request (never from OperationFrom, so that the
// server's check of the token against X-Tenant compares two independent
// sources).
type tenantStatus struct{ next idem.StatusChecker }

func (s tenantStatus) CheckStatus(ctx context.Context, q idem.StatusQuery) (idem.Status, error) {
	tenant, do := q.Record.Header.Get(crashTenantHeader), q.Do
	q.Do = func(req *http.Request) (*http.Response, error) {
		req.Header.Set(crashTenantHeader, tenant)
		return do(req)
	}
	return s.next.CheckStatus(ctx, q)
}

// crashAuthorize is the Authorize of a client holding creds (tenant →
// token); own is its Config.Scope. It chooses the token by the scope of
// the operation the request is for (OperationFrom). A client that holds
// no token for that scope has taken up an operation of another tenant: it
// sends its own token, as an application with one credential would, and
// the server reports a token of another tenant. Each request is printed:
// "au a|s <scope> <id> <form>", a for an attempt, s for a status check,
// and the key's form as the request carries it (header:quoted|bare).
func crashAuthorize(out *crashOut, own string, creds map[string]string) func(*http.Request) error {
	return func(r *http.Request) error {
		op, ok := idem.OperationFrom(r.Context())
		if !ok {
			// Sent without a credential: the server refuses it and
			// audits token=none.
			out.printf("fail authorize: %s %s names no operation", r.Method, r.URL.Path)
			return nil
		}
		token, ok := creds[op.Scope]
		if !ok {
			token = creds[own]
		}
		r.Header.Set("Authorization", "Bearer "+token)
		kind := "a"
		if op.StatusCheck {
			kind = "s"
		}
		out.printf("au %s %s %s %s", kind, op.Scope, op.ID, keyFormOf(r.Header))
		return nil
	}
}

// keyFormOf says which key header h carries, and how: "X-Request-Key:quoted",
// "Idempotency-Key:bare", "none", or both joined by "+".
func keyFormOf(h http.Header) string {
	var forms []string
	for _, name := range []string{crashKeyHeader, "Idempotency-Key"} {
		if v := h.Get(name); v != "" {
			form := "bare"
			if strings.HasPrefix(v, `"`) {
				form = "quoted"
			}
			forms = append(forms, name+":"+form)
		}
	}
	if len(forms) == 0 {
		return "none"
	}
	return strings.Join(forms, "+")
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
	// (N: the first operation number no life took yet), followed in the
	// tenants configuration by the key form and the tenancy of its
	// clients (crashFormCustom or crashFormDefault, crashOneClient or
	// crashSharedScope).
	stdin := bufio.NewReader(os.Stdin)
	line, err := stdin.ReadString('\n')
	start := strings.Fields(line)
	if err != nil || len(start) < 2 || (start[0] != "go" && start[0] != "final") {
		return fmt.Errorf("reading the start line on stdin: %q %v", line, err)
	}
	final := start[0] == "final"
	next, err := strconv.Atoi(start[1])
	if err != nil {
		return fmt.Errorf("the start line %q: %w", line, err)
	}
	tokens := crashTokens(os.Getenv("IDEM_CRASHLOOP_TOKENS")) // nil: the default configuration
	form, tenancy := crashFormCustom, crashOneClient
	if tokens != nil {
		if len(start) != 4 {
			return fmt.Errorf("the start line %q names no key form and tenancy", line)
		}
		form, tenancy = start[2], start[3]
	}
	// A life whose clients have the default key form creates no
	// operation: the server takes keys in X-Request-Key only. It finishes
	// what the journal holds, every attempt and status check in the form
	// journaled with the record.
	creates := form == crashFormCustom

	j, err := idem.OpenSQLite(os.Getenv("IDEM_JOURNAL"))
	if err != nil {
		return err
	}
	defer j.Close()
	base := os.Getenv("IDEM_URL")
	newClient := func(scope string, resumeScopes []string, creds map[string]string) (*idem.Client, error) {
		cfg := idem.Config{
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
		}
		if tokens != nil {
			cfg.Scope, cfg.ResumeScopes = scope, resumeScopes
			cfg.Authorize = crashAuthorize(out, scope, creds)
			cfg.Status = printingStatus{next: tenantStatus{idem.StatusEndpoint(base + "/idempotency")}, out: out}
			if form == crashFormCustom {
				cfg.KeyHeader, cfg.QuoteKey = crashKeyHeader, true
			}
		}
		return idem.New(cfg)
	}
	// clients: the client of each tenant ("" in the default configuration).
	clients := map[string]*idem.Client{}
	var resumers []*idem.Client
	switch {
	case tokens == nil:
		c, err := newClient("", nil, nil)
		if err != nil {
			return err
		}
		clients[""], resumers = c, []*idem.Client{c}
	case tenancy == crashSharedScope:
		c, err := newClient(crashTenants[0], crashTenants[:], tokens)
		if err != nil {
			return err
		}
		clients[crashTenants[0]], clients[crashTenants[1]], resumers = c, c, []*idem.Client{c}
	default:
		for _, tenant := range crashTenants {
			c, err := newClient(tenant, nil, map[string]string{tenant: tokens[tenant]})
			if err != nil {
				return err
			}
			clients[tenant] = c
			resumers = append(resumers, c)
		}
	}
	for _, c := range resumers {
		defer c.Close()
	}
	// opOf is operation id's Op and the client that drives it.
	opOf := func(id string) (*idem.Client, idem.Op) {
		if tokens == nil {
			return clients[""], crashOp(id, "", false)
		}
		tenant := crashTenantOf(id)
		return clients[tenant], crashOp(id, tenant, tenancy == crashSharedScope)
	}
	ctx := context.Background()
	if final {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, crashFinalBudget/2)
		defer cancel()
	}
	out.printf("ready")

	var (
		rep      idem.ResumeReport
		resumeMu sync.Mutex
		resumeWg sync.WaitGroup
		resumeEr error
	)
	for _, c := range resumers {
		resumeWg.Go(func() {
			r, err := c.Resume(ctx)
			resumeMu.Lock()
			defer resumeMu.Unlock()
			rep.Claimed += r.Claimed
			rep.Succeeded += r.Succeeded
			rep.Rejected += r.Rejected
			rep.Pending += r.Pending
			rep.Unknown += r.Unknown
			rep.Expired += r.Expired
			rep.Failed += r.Failed
			resumeEr = cmp.Or(resumeEr, err)
		})
	}
	resumeWg.Wait()
	if resumeEr != nil {
		out.printf("fail resume %v", resumeEr)
		return resumeEr
	}
	out.printf("resumed %d %d %d %d", rep.Claimed, rep.Succeeded, rep.Remaining(), rep.Failed)
	if rep.Failed > 0 {
		// A journal error or a lost lease, with no other live worker.
		out.printf("fail resume: %d operations could not be driven", rep.Failed)
	}

	// What the journal holds unsettled goes first: those whose lease has
	// lapsed at once, those still leased by the life just killed when it
	// lapses, so that no worker sits waiting on a lease while new work is
	// there to do (a life that creates nothing takes them all at once).
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
		if len(left) > 0 && (final || !creates || !left[0].Lease.Held(time.Now())) {
			id := left[0].ID
			left = left[1:]
			return id, true
		}
		if final || !creates {
			return "", false
		}
		n := next
		next++
		out.printf("take %d", n) // before Do can journal it
		return crashOpID(n), true
	}

	var hard atomic.Int32
	drive := func(id string) {
		c, op := opOf(id)
		for {
			res, err := c.Do(ctx, op)
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
				out.printf("fail %s ended %s without an error", id, res.State)
				hard.Add(1)
				return
			case errors.Is(err, idem.ErrRejected):
				// Definitive: every later life gets the same answer.
				out.printf("fail %s rejected: %v", id, err)
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
	wg.Wait() // in final mode, or in a life that creates nothing: otherwise the parent kills us first
	if !final {
		// Nothing left to do but wait for the kill.
		out.printf("idle")
		_, _ = io.Copy(io.Discard, stdin)
		return nil
	}

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
	form    string        // tenants configuration: crashFormCustom or crashFormDefault
	tenancy string        // tenants configuration: crashOneClient or crashSharedScope
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

// begin lets the life start: line is "go N" or "final N", and in the
// tenants configuration the form and tenancy of its clients.
func (ch *crashChild) begin(t *testing.T, line string) {
	t.Helper()
	ch.started = time.Now()
	if f := strings.Fields(line); len(f) == 4 {
		ch.form, ch.tenancy = f[2], f[3]
	}
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
	idle         int // lives that had nothing left to do before their kill

	// The tenants configuration: the requests the lives' Authorize saw,
	// by the form of the lives' clients, then attempt ("a") or status
	// check ("s"), then the key's form on the request.
	requests map[string]map[string]map[string]int
	// wrongForm lists requests whose key was not in crashKeyForm.
	wrongForm []string
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
		case "au":
			// au a|s <scope> <id> <form>
			if len(f) != 5 {
				tl.fails = append(tl.fails, fmt.Sprintf("life %d: malformed line %q", life, line))
				break
			}
			if tl.requests == nil {
				tl.requests = map[string]map[string]map[string]int{}
			}
			byKind := tl.requests[ch.form]
			if byKind == nil {
				byKind = map[string]map[string]int{}
				tl.requests[ch.form] = byKind
			}
			if byKind[f[1]] == nil {
				byKind[f[1]] = map[string]int{}
			}
			byKind[f[1]][f[4]]++
			if f[4] != crashKeyForm {
				tl.wrongForm = append(tl.wrongForm, fmt.Sprintf("life %d (%s form) sent %s of %s (%s) with the key as %s",
					life, ch.form, map[string]string{"a": "an attempt", "s": "a status check"}[f[1]], f[3], f[2], f[4]))
			}
		case "idle":
			tl.idle++
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

// crashLoopKills is the number of client kills of a configuration whose
// bounded run (CI) makes ciKills.
func crashLoopKills(t *testing.T, ciKills int) int {
	if *crashLoopKillsFlag > 0 {
		return *crashLoopKillsFlag
	}
	if v := os.Getenv("IDEM_CRASHLOOP_KILLS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "IDEM_CRASHLOOP_KILLS")
		return n
	}
	return ciKills
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
	// Its processes and files are its own: it runs beside the other
	// parallel tests instead of before them.
	t.Parallel()
	// One tenant, the key in Idempotency-Key, no credentials.
	t.Run("default", func(t *testing.T) { runCrashLoop(t, false, 200) })
	// Issue 10's configuration: two tenants with their own tokens, the key
	// in X-Request-Key, quoted; half the lives resume with clients of the
	// default key form.
	t.Run("tenants", func(t *testing.T) { runCrashLoop(t, true, 100) })
}

// runCrashLoop runs the crash loop in one configuration: with tenants, the
// tenants configuration (see the top of the file). ciKills is its number
// of client kills unless -crashloop.kills or IDEM_CRASHLOOP_KILLS says.
func runCrashLoop(t *testing.T, tenants bool, ciKills int) {
	kills := crashLoopKills(t, ciKills)
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
	childEnv := []string{"IDEM_JOURNAL=" + jpath}
	auditPath := filepath.Join(dir, "audit.log")
	if tenants {
		// Each tenant's token, new for each run; the server takes keys in
		// X-Request-Key only, quoted, and refuses and audits anything
		// else, and any request without its tenant's token.
		var pairs []string
		for _, tenant := range crashTenants {
			pairs = append(pairs, fmt.Sprintf("%s=tok-%s-%016x", tenant, tenant, rnd.Uint64()))
		}
		tokens := strings.Join(pairs, ",")
		serverFlags = append(serverFlags, "-key-header", crashKeyHeader, "-key-quoted", "-tenant-tokens", tokens, "-audit", auditPath)
		childEnv = append(childEnv, "IDEM_CRASHLOOP_TOKENS="+tokens)
	}
	srv := startServerProcess(t, dir, "127.0.0.1:0", serverFlags...)
	u, err := url.Parse(srv.url)
	require.NoError(t, err)
	ordersPath := filepath.Join(dir, "orders.db")
	orders, err := sql.Open("sqlite3", "file:"+ordersPath+"?_query_only=1&_busy_timeout=10000")
	require.NoError(t, err)
	defer orders.Close()
	spawn := func() *crashChild {
		return spawnCrashChild(t, slices.Concat(childEnv, []string{"IDEM_URL=" + srv.url})...)
	}
	// startLine is the line that starts a life: its mode, the first number
	// no life took yet, and in the tenants configuration its clients' key
	// form and tenancy (a final life: the default form, a client per
	// tenant, to settle and answer everything in the journaled form).
	lives := map[string]int{} // tenants configuration: lives by form and tenancy
	startLine := func(mode string, next int) string {
		if !tenants {
			return fmt.Sprintf("%s %d", mode, next)
		}
		form, tenancy := crashFormDefault, crashOneClient
		if mode != "final" {
			if rnd.IntN(2) == 0 {
				form = crashFormCustom
			}
			if rnd.IntN(2) == 0 {
				tenancy = crashSharedScope
			}
			lives[form+"/"+tenancy]++
		}
		return fmt.Sprintf("%s %d %s %s", mode, next, form, tenancy)
	}
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
		ch.begin(t, startLine("go", tally.maxTaken+1))
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
		ch.begin(t, startLine("final", tally.maxTaken+1))
		spare = spawn()
		exited := ch.wait(deadline)
		tally.add(life, ch)
		life++
		finalLives++
		out := ch.output()
		done = exited && ch.waitErr == nil && len(out) > 0 && strings.HasPrefix(out[len(out)-1], "done ")
		if !done && slices.ContainsFunc(out, func(l string) bool { return strings.HasPrefix(l, "fail ") && strings.Contains(l, " rejected: ") }) {
			// A rejection is journaled: every later life answers it
			// again. The checks below say which.
			t.Logf("final life %d met a rejection, which no later life can undo; no more lives", finalLives)
			break
		}
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
	duplicates, lost, ghosts, wrongKey, wrongScope, recordForms := 0, 0, 0, 0, 0, map[string]int{}
	wantScope, wantHeader, wantQuoted := func(string) string { return "default" }, "Idempotency-Key", false
	if tenants {
		wantScope, wantHeader, wantQuoted = crashTenantOf, crashKeyHeader, true
	}
	for id, info := range ops {
		rs := byItem[id]
		// The operation's scope, its order's tenant, and the key's wire
		// form journaled with it.
		scope := wantScope(id)
		switch {
		case info.rec.Scope != scope:
			wrongScope++
			problem("%s (key %s) is journaled in scope %q, not %q", id, info.rec.Key, info.rec.Scope, scope)
		case len(rs) == 1 && rs[0].tenant != scope:
			wrongScope++
			problem("%s (key %s): its order %s belongs to tenant %q, not %q", id, info.rec.Key, rs[0].id, rs[0].tenant, scope)
		}
		form := fmt.Sprintf("%s:%t", info.rec.KeyHeader, info.rec.KeyQuoted)
		recordForms[form]++
		if info.rec.KeyHeader != wantHeader || info.rec.KeyQuoted != wantQuoted {
			problem("%s (key %s) is journaled with the key in %s, not %s:%t", id, info.rec.Key, form, wantHeader, wantQuoted)
		}
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
	if n := len(tally.wrongForm); n > 0 {
		problem("the lives sent %d requests with the key not as %s; the first: %s", n, crashKeyForm, strings.Join(tally.wrongForm[:min(n, 5)], "; "))
	}

	// What the server's checks saw (tenants configuration): every request
	// of every server life, with the key in X-Request-Key, quoted, and
	// its tenant's token, or what was wrong.
	var (
		audited                 int
		auditedBy               = map[string]int{} // route/tenant
		wrongHeader, wrongToken int
		wrongHeaderBy           = map[string]int{}
		wrongTokenBy            = map[string]int{}
	)
	if tenants {
		b, err := os.ReadFile(auditPath)
		require.NoError(t, err, "the server's audit log")
		for line := range strings.Lines(string(b)) {
			// <method> <route> <tenant> header=<verdict> token=<verdict>
			f := strings.Fields(line)
			if len(f) != 5 || !strings.HasPrefix(f[3], "header=") || !strings.HasPrefix(f[4], "token=") {
				problem("server audit: malformed line %q", line)
				continue
			}
			audited++
			auditedBy[f[1]+"/"+f[2]]++
			if v := strings.TrimPrefix(f[3], "header="); v != "ok" {
				wrongHeader++
				wrongHeaderBy[v]++
			}
			if v := strings.TrimPrefix(f[4], "token="); v != "ok" {
				wrongToken++
				wrongTokenBy[v]++
			}
		}
		if wrongHeader > 0 {
			problem("the server saw %d requests with the key in another header or form than %s, quoted: %v", wrongHeader, crashKeyHeader, wrongHeaderBy)
		}
		if wrongToken > 0 {
			problem("the server saw %d requests without the token of their tenant: %v", wrongToken, wrongTokenBy)
		}
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
	t.Logf("  orders             %d; duplicates %d, lost %d, under another key %d, in another tenant or scope %d, for no journaled operation %d; pending although applied %d",
		orderCount, duplicates, lost, wrongKey, wrongScope, ghosts, len(pendingApplied))
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
	defaultFormRequests := 0
	if tenants {
		byScope := map[string]int{}
		for _, info := range ops {
			byScope[info.rec.Scope]++
		}
		for _, byForm := range tally.requests[crashFormDefault] {
			for _, n := range byForm {
				defaultFormRequests += n
			}
		}
		t.Logf("  tenants            operations by scope %v; journaled key forms %v", byScope, recordForms)
		t.Logf("                     lives by key form/tenancy %v; %d lives idle before their kill (nothing left)", lives, tally.idle)
		t.Logf("                     requests the lives' Authorize saw, by the lives' key form, attempt (a) or status check (s), and the form sent: %v",
			tally.requests)
		t.Logf("  server checks      %d requests audited by route/tenant %v;", audited, auditedBy)
		t.Logf("                     with the key in another header or form %d %v, without their tenant's token %d %v",
			wrongHeader, wrongHeaderBy, wrongToken, wrongTokenBy)
	}
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
	if tenants {
		assert.Zero(t, wrongHeader, "requests with the key in another header or form (seed %d)", seed)
		assert.Zero(t, wrongToken, "requests with another tenant's token, or none (seed %d)", seed)
		assert.GreaterOrEqual(t, auditedBy["orders/"+crashTenants[0]]+auditedBy["orders/"+crashTenants[1]], len(ops),
			"the server's checks saw every operation's request")
		assert.Positive(t, defaultFormRequests,
			"lives whose clients have the default key form sent requests: otherwise the run shows nothing of the journaled form")
	}
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
