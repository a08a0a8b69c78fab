package postgres_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/mattn/go-sqlite3" // reads the orders file the replicas share
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/examples/server/orders"
	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
	"github.com/idemkit/idem/server"
)

// The environment of a "replica" child process.
const (
	replicaSchemaEnv   = "IDEM_REPLICA_SCHEMA"    // the postgres.Store's schema
	replicaKeysEnv     = "IDEM_REPLICA_KEYS"      // instead, an SQLite key store of its own at this path (the control)
	replicaOrdersEnv   = "IDEM_REPLICA_ORDERS"    // the orders database, one file for every replica
	replicaExecLogEnv  = "IDEM_REPLICA_EXEC_LOG"  // the log of handler runs, one file for every replica
	replicaLockEnv     = "IDEM_REPLICA_LOCK"      // the middleware's LockTimeout
	replicaJitterEnv   = "IDEM_REPLICA_JITTER"    // a random hold of 0 to this before each run of the handler
	replicaHeldEnv     = "IDEM_REPLICA_HELD_KEYS" // keys whose runs are held after their order is committed…
	replicaHoldForEnv  = "IDEM_REPLICA_HOLD_FOR"  // …for this long, before the middleware stores the response
	replicaListenEvent = "listening http://"
)

func init() { children["replica"] = replicaMain }

// replicaMain is one replica of the orders API (examples/server/orders)
// behind the server middleware on a postgres.Store: the process the test
// below starts three of and SIGKILLs one of. It prints "listening
// http://ADDR" once it accepts connections and shuts down gracefully on
// SIGTERM.
//
// Every run of the orders handler appends "run TENANT KEY PID" to the exec
// log before anything else, and "done TENANT KEY PID STATUS ORDER" once the
// handler returned (its order is committed), each in one write to a file
// opened O_APPEND: the log counts the runs of every replica, the killed one
// included, in the order they happened. What the middleware did with the
// run goes there too: "told TENANT KEY PID" when it canceled the run's
// context because it could not keep the key's lock (ErrLockNotRenewed: no
// renewal succeeded for 2/3 of LockTimeout, the store out of reach or the
// process starved), and "outcome TENANT KEY PID STATUS TOOKOVER
// STOREFAILED" once the request ended (Config.OnOutcome). A run of a key named in
// IDEM_REPLICA_HELD_KEYS is then held, before the middleware stores its
// response: a SIGKILL in that hold leaves the key in progress with its
// order committed, the window in which only the lock's staleness and the
// application's own guard stand between a retry and a second order.
func replicaMain() error {
	lockTimeout, err := time.ParseDuration(os.Getenv(replicaLockEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", replicaLockEnv, err)
	}
	jitter, err := time.ParseDuration(os.Getenv(replicaJitterEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", replicaJitterEnv, err)
	}
	held := map[string]bool{}
	var holdFor time.Duration
	if keys := os.Getenv(replicaHeldEnv); keys != "" {
		for k := range strings.SplitSeq(keys, ",") {
			held[k] = true
		}
		if holdFor, err = time.ParseDuration(os.Getenv(replicaHoldForEnv)); err != nil {
			return fmt.Errorf("%s: %w", replicaHoldForEnv, err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	var store server.Store
	if path := os.Getenv(replicaKeysEnv); path != "" {
		s, err := server.OpenSQLiteStore(path)
		if err != nil {
			return err
		}
		defer s.Close()
		store = s
	} else {
		pool, err := pgxpool.New(context.Background(), pgtest.DSN())
		if err != nil {
			return err
		}
		defer pool.Close()
		s, err := postgres.OpenStore(context.Background(), pool, postgres.Schema(os.Getenv(replicaSchemaEnv)))
		if err != nil {
			return err
		}
		defer s.Close()
		store = s
	}
	app, err := orders.New(os.Getenv(replicaOrdersEnv))
	if err != nil {
		return err
	}
	defer app.Close()
	execLog, err := os.OpenFile(os.Getenv(replicaExecLogEnv), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer execLog.Close()
	pid := os.Getpid()
	mw, err := server.New(server.Config{Store: store, Scope: orders.Tenant, LockTimeout: lockTimeout,
		OnOutcome: func(_ context.Context, o server.Outcome) {
			if o.Kind == server.OutcomeRan {
				_, _ = fmt.Fprintf(execLog, "outcome %s %s %d %d %t %t\n", o.Scope, o.Key, pid, o.Status, o.TookOver, o.StoreFailed)
			}
		}})
	if err != nil {
		return err
	}
	defer mw.Close()

	logged := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := orders.Tenant(r)
		key, _ := server.KeyFromContext(r.Context())
		if _, err := fmt.Fprintf(execLog, "run %s %s %d\n", tenant, key, pid); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		// The run's context ends when the middleware is done with it, or
		// before, when it tells the run to stop.
		go func() {
			<-r.Context().Done()
			if errors.Is(context.Cause(r.Context()), server.ErrLockNotRenewed) {
				_, _ = fmt.Fprintf(execLog, "told %s %s %d\n", tenant, key, pid)
			}
		}()
		if jitter > 0 {
			time.Sleep(rand.N(jitter + 1))
		}
		rec := httptest.NewRecorder()
		app.Handler().ServeHTTP(rec, r)
		var o orders.Order
		_ = json.Unmarshal(rec.Body.Bytes(), &o)
		if _, err := fmt.Fprintf(execLog, "done %s %s %d %d %s\n", tenant, key, pid, rec.Code, orDash(o.ID)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if held[key] {
			select {
			case <-time.After(holdFor):
			case <-r.Context().Done():
			}
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(logged))
	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Printf("%s%s\n", replicaListenEvent, ln.Addr())

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// replicaProc is a running replica child.
type replicaProc struct {
	*childProc
	url string
}

// startReplicaProc starts a replica child with env and waits until it
// listens. The test's cleanup stops it, if the test did not.
func startReplicaProc(t *testing.T, name string, env ...string) *replicaProc {
	t.Helper()
	listening := &listenWatcher{addr: make(chan string, 1)}
	p := &replicaProc{childProc: startChild(t, "replica", name, listening, env...)}
	select {
	case addr := <-listening.addr:
		p.url = "http://" + addr
	case <-p.waited:
		t.Fatalf("%s exited before it listened: %v\n%s", name, p.err, p.stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not listen within 30 s\n%s", name, p.stderr)
	}
	return p
}

// listenWatcher is a child's stdout: it hands over the address of the
// "listening http://ADDR" line.
type listenWatcher struct {
	mu   sync.Mutex
	buf  []byte
	addr chan string
	sent bool
}

func (w *listenWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for !w.sent {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		line := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		if addr, ok := strings.CutPrefix(line, replicaListenEvent); ok {
			w.addr <- addr
			w.sent = true
		}
	}
	return len(p), nil
}

// tenantKey names one key of one tenant.
type tenantKey struct{ tenant, key string }

func (k tenantKey) String() string { return k.tenant + "/" + k.key }

// handlerRun is one run of the orders handler, as the exec log tells it.
type handlerRun struct {
	pid   int
	line  int    // of its "run" line in the log
	done  bool   // the handler returned: its order is committed
	code  int    // the handler's status, once done
	order string // the order it answered with, once done
	// told: the middleware canceled the run's context, because it could
	// not keep the key's lock (ErrLockNotRenewed).
	told bool
	// outcome is the status the middleware answered the run's request
	// with (0: none logged, as in a replica killed), tookOver whether the
	// run took a stale lock over.
	outcome  int
	tookOver bool
	// storeFailed: its response could not be stored (the store out of
	// reach); it is stored in the background while the lock is renewed.
	storeFailed bool
}

// execLog is the exec log parsed: every key's runs in the order they
// started, and the line of the kill marker the test wrote (-1: none).
type execLog struct {
	runs     map[tenantKey][]*handlerRun
	killLine int
}

// readExecLog parses the exec log. A last line without its newline is
// still being written and is left for the next read.
func readExecLog(path string) (execLog, error) {
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return execLog{}, err
	}
	l := execLog{runs: map[tenantKey][]*handlerRun{}, killLine: -1}
	lines := strings.Split(string(b), "\n")
	for i, line := range lines[:len(lines)-1] {
		f := strings.Fields(line)
		bad := fmt.Errorf("exec log line %d: %q", i+1, line)
		switch {
		case len(f) == 2 && f[0] == "kill":
			l.killLine = i
		case len(f) == 4 && f[0] == "run":
			pid, err := strconv.Atoi(f[3])
			if err != nil {
				return execLog{}, bad
			}
			k := tenantKey{f[1], f[2]}
			l.runs[k] = append(l.runs[k], &handlerRun{pid: pid, line: i})
		case len(f) == 6 && f[0] == "done":
			pid, err1 := strconv.Atoi(f[3])
			code, err2 := strconv.Atoi(f[4])
			if err1 != nil || err2 != nil {
				return execLog{}, bad
			}
			// The latest run of the key in that process that is not done.
			runs := l.runs[tenantKey{f[1], f[2]}]
			j := len(runs) - 1
			for j >= 0 && (runs[j].pid != pid || runs[j].done) {
				j--
			}
			if j < 0 {
				return execLog{}, fmt.Errorf("%w: done without its run", bad)
			}
			runs[j].done, runs[j].code, runs[j].order = true, code, f[5]
		case len(f) == 4 && f[0] == "told", len(f) == 7 && f[0] == "outcome":
			pid, err := strconv.Atoi(f[3])
			if err != nil {
				return execLog{}, bad
			}
			// The earliest run of the key in that process not yet told
			// (a "told" may come after its run's outcome), or without an
			// outcome.
			runs := l.runs[tenantKey{f[1], f[2]}]
			j := slices.IndexFunc(runs, func(r *handlerRun) bool {
				return r.pid == pid && (f[0] == "told" && !r.told || f[0] == "outcome" && r.outcome == 0)
			})
			if j < 0 {
				return execLog{}, fmt.Errorf("%w: %s without its run", bad, f[0])
			}
			if f[0] == "told" {
				runs[j].told = true
				continue
			}
			code, err := strconv.Atoi(f[4])
			if err != nil {
				return execLog{}, bad
			}
			runs[j].outcome, runs[j].tookOver, runs[j].storeFailed = code, f[5] == "true", f[6] == "true"
		default:
			return execLog{}, bad
		}
	}
	return l, nil
}

// checkRuns holds the exec log to the promise: every key's handler ran
// once across the replicas, and ran again only once every run before had
// lost its hold on the key: it was in flight in the replica killed
// (killed; 0: none was) and the new run came after the kill, or the
// middleware told it to stop because it could not keep the key's lock (no
// renewal succeeded for 2/3 of LockTimeout: the store was out of reach, or
// the process starved), or the store was out of reach when its response
// was to be stored (and, still, for LockTimeout); and the new run took the
// stale lock over. Every
// run that returned answered with the key's one order in the orders table
// (orderOf), which a run after another finds by the table's UNIQUE guard;
// only a run told to stop may have failed instead. It returns every breach
// it finds.
func checkRuns(l execLog, keys []tenantKey, killed int, orderOf map[tenantKey]string) []string {
	var breaches []string
	for _, k := range keys {
		runs := l.runs[k]
		if len(runs) == 0 {
			breaches = append(breaches, fmt.Sprintf("%s never ran", k))
			continue
		}
		for i, r := range runs[1:] {
			for _, before := range runs[:i+1] {
				died := before.pid == killed && l.killLine >= 0 && r.line > l.killLine
				if !died && !before.told && !before.storeFailed {
					breaches = append(breaches, fmt.Sprintf("%s ran %d times (pids %v): a run in pid %d while the run in pid %d held the key (neither killed before it nor told to stop)",
						k, len(runs), runPids(runs), r.pid, before.pid))
				}
			}
			if r.outcome != 0 && !r.tookOver {
				breaches = append(breaches, fmt.Sprintf("%s ran again in pid %d without taking a stale lock over", k, r.pid))
			}
		}
		for _, r := range runs {
			if r.done && (r.code != http.StatusCreated || r.order != orderOf[k]) && !(r.told && r.code >= 500 && r.order == "-") {
				breaches = append(breaches, fmt.Sprintf("%s: a run in pid %d answered %d %s; the orders table holds %q", k, r.pid, r.code, r.order, orderOf[k]))
			}
		}
	}
	return breaches
}

func runPids(runs []*handlerRun) []int {
	pids := make([]int, len(runs))
	for i, r := range runs {
		pids[i] = r.pid
	}
	return pids
}

// readOrders returns every order in the orders file: its ID by key, and how
// many orders each key has.
func readOrders(t *testing.T, path string) (orderOf map[tenantKey]string, count map[tenantKey]int, items map[tenantKey]string) {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro&_busy_timeout=10000")
	require.NoError(t, err)
	defer db.Close()
	rows, err := db.Query(`SELECT id, tenant, idem_key, item FROM orders`)
	require.NoError(t, err)
	defer rows.Close()
	orderOf, count, items = map[tenantKey]string{}, map[tenantKey]int{}, map[tenantKey]string{}
	for rows.Next() {
		var (
			id   int64
			k    tenantKey
			item string
		)
		require.NoError(t, rows.Scan(&id, &k.tenant, &k.key, &item))
		orderOf[k], items[k] = "ord_"+strconv.FormatInt(id, 10), item
		count[k]++
	}
	require.NoError(t, rows.Err())
	return orderOf, count, items
}

// sendTally counts what the senders saw.
type sendTally struct {
	requests, created, replayed, conflicts, serverErrors, connErrors atomic.Int64
}

// sendUntilCreated sends one key's order to the replicas, starting with
// replicas[first], moving on round robin after a connection error, a 409
// or a 5xx, until one answers 201, and returns the order's ID.
func sendUntilCreated(ctx context.Context, client *http.Client, replicas []*replicaProc, first int, k tenantKey, body string, tally *sendTally) (string, error) {
	var last string
	for i := first; ; i = (i + 1) % len(replicas) {
		if err := ctx.Err(); err != nil {
			return "", fmt.Errorf("%s: no 201 before the deadline; last answer: %s", k, last)
		}
		tally.requests.Add(1)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, replicas[i].url+"/orders", strings.NewReader(body))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(orders.TenantHeader, k.tenant)
		req.Header.Set(wire.KeyHeader, k.key)
		resp, err := client.Do(req)
		if err != nil {
			tally.connErrors.Add(1)
			last = err.Error()
			time.Sleep(5 * time.Millisecond)
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			tally.connErrors.Add(1)
			last = err.Error()
			continue
		}
		last = fmt.Sprintf("%s: %d %s", replicas[i].name, resp.StatusCode, b)
		switch {
		case resp.StatusCode == http.StatusCreated:
			tally.created.Add(1)
			if resp.Header.Get(wire.ReplayedHeader) == "true" {
				tally.replayed.Add(1)
			}
			var o orders.Order
			if err := json.Unmarshal(b, &o); err != nil || o.ID == "" {
				return "", fmt.Errorf("%s: 201 without an order: %s", k, last)
			}
			return o.ID, nil
		case resp.StatusCode == http.StatusConflict:
			tally.conflicts.Add(1)
		case resp.StatusCode >= 500:
			tally.serverErrors.Add(1)
			if resp.Header.Get(wire.ReplayedHeader) == "true" {
				// A stored failure is the key's answer for good.
				return "", fmt.Errorf("%s: a stored failure: %s", k, last)
			}
		default:
			return "", fmt.Errorf("%s: unexpected answer %s", k, last)
		}
		// The replicas ask for Retry-After: 1 s; a shorter pause keeps the
		// run short and the replicas busy.
		time.Sleep(20*time.Millisecond + rand.N(30*time.Millisecond))
	}
}

// TestReplicaProcessesRunEachKeyOnce starts three replicas of the orders
// API, each a process of its own with its own pool on one postgres.Store
// schema, all on one orders file, and sends every key three times at once,
// each copy to a different replica first, retrying round robin until it
// gets a 201. Replica 1 holds a designated set of keys after committing
// their orders, before their responses are stored (their copies for the
// other replicas go once replica 1 runs them, so that it is the one that
// holds them); once it holds them all and has run a few other keys, the
// test SIGKILLs it, amid the other keys' traffic. The exec log, which
// every replica appends one line to per run of the handler, must show one
// run per key, except for keys whose run was in flight in the killed
// replica: those may run once more in a survivor once their lock went stale
// (LockTimeout), and that run must find the order the killed run committed
// (the orders table's UNIQUE guard). Every designated key must have run
// that way: the kill landed mid-request. Each key has one order, and every
// sender of a key got that order.
//
// A replica that cannot renew a key's lock for 2/3 of LockTimeout (its
// store out of reach, or its process starved of CPU on a loaded machine)
// is told to stop (ErrLockNotRenewed), and its key may run again once the
// lock is stale: the exec log records it, and checkRuns allows that second
// run, which the UNIQUE guard answers, as the middleware documents.
func TestReplicaProcessesRunEachKeyOnce(t *testing.T) {
	// As TestFleetOfWorkerProcesses: beside the other parallel tests.
	t.Parallel()
	testReplicas(t, plainDB(t))
}

// TestReplicaProcessesRunEachKeyOnceUnderFaults is the test above while
// the replicas' database misbehaves: behind a proxy that injects faults one
// after another, and on a server of the test's own that crashes and
// restarts, while the keys are sent. IDEM_PG_FLEET_SOAK=N runs N rounds of
// each.
func TestReplicaProcessesRunEachKeyOnceUnderFaults(t *testing.T) {
	rounds := soakRounds(t)
	for _, db := range []struct {
		name string
		open func(*testing.T) *fleetDB
	}{{"proxy faults", proxiedDB}, {"database restarts", crashingDB}} {
		t.Run(db.name, func(t *testing.T) {
			var total replicaFigures
			for round := range rounds {
				if !t.Run(fmt.Sprint("round ", round+1), func(t *testing.T) { total.add(testReplicas(t, db.open(t))) }) {
					break
				}
			}
			t.Logf("figures: %d round(s), %s", rounds, &total)
		})
	}
}

// replicaFigures is what one run of the replicas test counted.
type replicaFigures struct {
	keys, requests, runs, afterKill, afterTold, duplicates, lost, breaches int
	faults                                                                 map[string]int
}

func (f *replicaFigures) add(o replicaFigures) {
	f.keys += o.keys
	f.requests += o.requests
	f.runs += o.runs
	f.afterKill += o.afterKill
	f.afterTold += o.afterTold
	f.duplicates += o.duplicates
	f.lost += o.lost
	f.breaches += o.breaches
	for k, n := range o.faults {
		if f.faults == nil {
			f.faults = map[string]int{}
		}
		f.faults[k] += n
	}
}

func (f *replicaFigures) String() string {
	return fmt.Sprintf("%d keys, %d requests, %d handler runs (%d again after the kill, %d again after a run that lost its hold: told to stop, or its response not storable); faults %v; duplicate orders %d, keys without their order %d, exec-log breaches %d",
		f.keys, f.requests, f.runs, f.afterKill, f.afterTold, f.faults, f.duplicates, f.lost, f.breaches)
}

func testReplicas(t *testing.T, db *fleetDB) replicaFigures {
	const (
		perTenant   = 30
		heldPer     = 3 // the first keys of each tenant are the designated ones
		killAmid    = 6 // other keys replica 1 has run when it is killed
		lockTimeout = 3 * time.Second
	)
	tenants := []string{"acme", "globex", "initech"}
	schema := db.schema
	dir := t.TempDir()
	ordersPath, execPath := filepath.Join(dir, "orders.db"), filepath.Join(dir, "exec.log")
	createOrders(t, ordersPath)

	var heldKeys []string
	for i := range heldPer {
		heldKeys = append(heldKeys, keyName(i))
	}
	common := []string{
		replicaSchemaEnv + "=" + schema, replicaOrdersEnv + "=" + ordersPath, replicaExecLogEnv + "=" + execPath,
		replicaLockEnv + "=" + lockTimeout.String(), replicaJitterEnv + "=50ms",
	}
	common = append(common, db.env()...)
	replicas := []*replicaProc{
		startReplicaProc(t, "replica-0", common...),
		startReplicaProc(t, "replica-1", append(slices.Clip(common),
			replicaHeldEnv+"="+strings.Join(heldKeys, ","), replicaHoldForEnv+"=5m")...),
		startReplicaProc(t, "replica-2", common...),
	}
	victim := replicas[1]
	killed := victim.pid()
	stopFaults := db.injectFaults(t)

	var keys, held []tenantKey
	for _, tenant := range tenants {
		for i := range perTenant {
			k := tenantKey{tenant, keyName(i)}
			keys = append(keys, k)
			if i < heldPer {
				held = append(held, k)
			}
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	transport := &http.Transport{MaxIdleConnsPerHost: 512}
	client := &http.Client{Transport: transport, Timeout: time.Minute}
	t.Cleanup(transport.CloseIdleConnections)

	// The watcher tells each designated key's other senders when replica 1
	// runs it, so that replica 1 is the one that holds it, and the test
	// when replica 1 holds them all, committed, and has run killAmid other
	// keys (or every other key has started somewhere), so that the kill
	// lands amid their traffic.
	startedInVictim := map[tenantKey]chan struct{}{}
	for _, k := range held {
		startedInVictim[k] = make(chan struct{})
	}
	allHeld := make(chan struct{})
	watchErr := make(chan error, 1)
	go func() {
		watchErr <- func() error {
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				l, err := readExecLog(execPath)
				if err != nil {
					return err
				}
				committed := 0
				for _, k := range held {
					for _, r := range l.runs[k] {
						if r.pid != killed {
							continue
						}
						select {
						case <-startedInVictim[k]:
						default:
							close(startedInVictim[k])
						}
						if r.done {
							committed++
						}
					}
				}
				// Other keys' runs in replica 1, and other keys started
				// anywhere.
				othersInVictim, othersStarted := 0, 0
				for k, runs := range l.runs {
					if startedInVictim[k] != nil {
						continue
					}
					othersStarted++
					if slices.ContainsFunc(runs, func(r *handlerRun) bool { return r.pid == killed }) {
						othersInVictim++
					}
				}
				if committed == len(held) && (othersInVictim >= killAmid || othersStarted == len(keys)-len(held)) {
					close(allHeld)
					return nil
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("replica 1 held %d of the %d designated keys when the test gave up (%d other keys ran there)", committed, len(held), othersInVictim)
				case <-tick.C:
				}
			}
		}()
	}()

	var (
		tally    sendTally
		mu       sync.Mutex
		got      = map[tenantKey][]string{}
		sendErrs []error
		wg       sync.WaitGroup
	)
	began := time.Now()
	for n, k := range keys {
		body := fmt.Sprintf(`{"item":"book-%s-%s","quantity":%d}`, k.tenant, k.key, 1+n%7)
		designated := startedInVictim[k] != nil
		for s := range replicas {
			wg.Go(func() {
				switch {
				case designated && s != 1:
					// Sent once replica 1 runs the key: it is held there.
					select {
					case <-startedInVictim[k]:
					case <-ctx.Done():
					}
				case !designated:
					// The other keys arrive over about a second, before,
					// during and after the kill.
					time.Sleep(time.Duration(n) * 12 * time.Millisecond)
				}
				id, err := sendUntilCreated(ctx, client, replicas, s, k, body, &tally)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					sendErrs = append(sendErrs, err)
					return
				}
				got[k] = append(got[k], id)
			})
		}
	}

	// The watcher returns nil once replica 1 holds its keys (having closed
	// allHeld), or an error. Waiting on its result alone: a select on both
	// would pick either when both are ready, and fail the test on a nil.
	if err := <-watchErr; err != nil {
		cancel()
		wg.Wait()
		require.NoError(t, err)
	}
	<-allHeld
	// The marker goes in before the kill: a run after it may be after the
	// kill, a run before it certainly is not.
	f, err := os.OpenFile(execPath, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = fmt.Fprintf(f, "kill %d\n", killed)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	killedAt := time.Now()
	victim.kill()
	wg.Wait()
	finished := time.Now()
	faults := stopFaults()
	require.Empty(t, sendErrs, "every sender gets a 201")

	// The survivors shut down gracefully, and the log is complete.
	for _, r := range replicas {
		if r != victim {
			assert.NoError(t, r.stop(), "%s exits cleanly on SIGTERM", r.name)
		}
	}
	var (
		ee *exec.ExitError
		ws syscall.WaitStatus
	)
	if errors.As(victim.err, &ee) {
		ws, _ = ee.Sys().(syscall.WaitStatus)
	}
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "replica 1 died of the SIGKILL: %v", victim.err)

	orderOf, count, items := readOrders(t, ordersPath)
	assert.Len(t, count, len(keys), "no order for anything but the keys sent")
	fig := replicaFigures{keys: len(keys), requests: int(tally.requests.Load()), faults: faults.byKind}
	for _, k := range keys {
		fig.duplicates += max(count[k]-1, 0)
		if count[k] == 0 || len(got[k]) < len(replicas) {
			fig.lost++
		}
		for _, id := range got[k] {
			if id != orderOf[k] {
				fig.duplicates++
			}
		}
		assert.Equal(t, 1, count[k], "%s has one order", k)
		assert.Equal(t, fmt.Sprintf("book-%s-%s", k.tenant, k.key), items[k], "%s's order is its own", k)
		require.Len(t, got[k], len(replicas), "every sender of %s got a 201", k)
		for _, id := range got[k] {
			assert.Equal(t, orderOf[k], id, "every sender of %s got its one order", k)
		}
	}

	l, err := readExecLog(execPath)
	require.NoError(t, err)
	breaches := checkRuns(l, keys, killed, orderOf)
	assert.Empty(t, breaches, "one run per key, and another only once the run before died or was told to stop")
	fig.breaches = len(breaches)

	// The kill landed mid-request: every designated key was committed and
	// held in replica 1 when it died, so it ran again in a survivor, whose
	// run the UNIQUE guard answered with the killed run's order; unless
	// replica 1 was told to stop first, as a starved or cut-off replica is.
	for _, k := range held {
		runs := l.runs[k]
		if assert.NotEmpty(t, runs, "%s ran", k) {
			assert.Equal(t, killed, runs[0].pid, "%s ran first in replica 1", k)
			assert.True(t, runs[0].done, "%s's order was committed in replica 1", k)
			assert.True(t, len(runs) >= 2 || runs[0].told, "%s ran again in a survivor after the kill, or replica 1 was told to stop; it ran in pids %v", k, runPids(runs))
			if len(runs) >= 2 {
				// checkRuns holds every run that answered to the order
				// replica 1 committed.
				assert.NotEqual(t, killed, runs[1].pid, "%s ran again in a survivor", k)
			}
		}
	}

	var (
		runs, reruns, guarded, inVictim, unfinished int
	)
	for _, k := range keys {
		rs := l.runs[k]
		runs += len(rs)
		if slices.ContainsFunc(rs, func(r *handlerRun) bool { return r.pid == killed }) {
			inVictim++
		}
		for i := range rs[1:] {
			if rs[i].told || rs[i].storeFailed {
				fig.afterTold++
				continue
			}
			fig.afterKill++
			reruns++
			if rs[i].done {
				guarded++
			} else {
				unfinished++
			}
		}
	}
	fig.runs = runs
	t.Logf("%d keys (%d tenants, %d held in replica 1), 3 senders each: %d requests, %d 201 (%d replayed), %d 409, %d 5xx, %d connection errors",
		len(keys), len(tenants), len(held), tally.requests.Load(), tally.created.Load(), tally.replayed.Load(),
		tally.conflicts.Load(), tally.serverErrors.Load(), tally.connErrors.Load())
	t.Logf("handler runs: %d for %d keys; %d keys ran in replica 1; re-runs after the kill: %d (%d found the killed run's order, %d had been killed before committing one); re-runs after a run that lost its hold: %d; orders: %d",
		runs, len(keys), inVictim, reruns, guarded, unfinished, fig.afterTold, len(count))
	t.Logf("time: %.2f s from the first request to the last 201, %.2f s of it after the kill (LockTimeout %s); faults injected: %s",
		finished.Sub(began).Seconds(), finished.Sub(killedAt).Seconds(), lockTimeout, faults)
	return fig
}

// TestReplicaProcessesControlDoubleRuns is the control of the test above:
// the same replicas and senders, each replica with a key store of its own
// (an SQLite file) instead of the shared postgres.Store, and no kill. Every
// replica then runs every key it is sent, the orders table's guard hides it
// from the senders (one order, one order ID), and the exec log's check
// above reports it.
func TestReplicaProcessesControlDoubleRuns(t *testing.T) {
	// Its files and processes are its own.
	t.Parallel()
	const perTenant = 4
	tenants := []string{"acme", "globex"}
	dir := t.TempDir()
	ordersPath, execPath := filepath.Join(dir, "orders.db"), filepath.Join(dir, "exec.log")
	createOrders(t, ordersPath)
	var replicas []*replicaProc
	for i := range 3 {
		replicas = append(replicas, startReplicaProc(t, fmt.Sprint("replica-", i),
			replicaKeysEnv+"="+filepath.Join(dir, fmt.Sprintf("keys-%d.db", i)),
			replicaOrdersEnv+"="+ordersPath, replicaExecLogEnv+"="+execPath,
			replicaLockEnv+"=3s", replicaJitterEnv+"=50ms"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	transport := &http.Transport{}
	client := &http.Client{Transport: transport}
	t.Cleanup(transport.CloseIdleConnections)

	var (
		keys  []tenantKey
		tally sendTally
		mu    sync.Mutex
		got   = map[tenantKey][]string{}
		wg    sync.WaitGroup
	)
	for _, tenant := range tenants {
		for i := range perTenant {
			k := tenantKey{tenant, keyName(i)}
			keys = append(keys, k)
			for s := range replicas {
				wg.Go(func() {
					id, err := sendUntilCreated(ctx, client, replicas, s, k, `{"item":"book","quantity":1}`, &tally)
					assert.NoError(t, err)
					mu.Lock()
					defer mu.Unlock()
					got[k] = append(got[k], id)
				})
			}
		}
	}
	wg.Wait()
	for _, r := range replicas {
		assert.NoError(t, r.stop(), "%s exits cleanly on SIGTERM", r.name)
	}

	orderOf, count, _ := readOrders(t, ordersPath)
	for _, k := range keys {
		assert.Equal(t, 1, count[k], "the guard keeps %s to one order", k)
		for _, id := range got[k] {
			assert.Equal(t, orderOf[k], id, "every sender of %s got one order", k)
		}
	}
	l, err := readExecLog(execPath)
	require.NoError(t, err)
	breaches := checkRuns(l, keys, 0, orderOf)
	assert.NotEmpty(t, breaches, "the exec log's check catches keys that run more than once")
	runs := 0
	for _, k := range keys {
		runs += len(l.runs[k])
	}
	t.Logf("without a shared store: %d keys, %d handler runs, %d keys flagged; e.g. %q", len(keys), runs, len(breaches), breaches[:min(1, len(breaches))])
}

func keyName(i int) string { return fmt.Sprintf("order-%02d", i) }

// createOrders creates the orders file before the replicas start, so that
// they open it rather than race to create it.
func createOrders(t *testing.T, path string) {
	t.Helper()
	app, err := orders.New(path)
	require.NoError(t, err)
	require.NoError(t, app.Close())
}
