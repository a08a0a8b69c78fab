package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
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

	_ "github.com/mattn/go-sqlite3" // reads the orders file the replicas share
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/examples/server/orders"
	"github.com/idemkit/idem/server"
)

// The environment of a replica child: the test binary run again as the
// example's main, with the example's flags.
const (
	replicaEnv     = "IDEM_FLEET_REPLICA"   // set: this process is a replica
	replicaLogEnv  = "IDEM_FLEET_EXEC_LOG"  // the log of handler runs, one file for every replica
	replicaHeldEnv = "IDEM_FLEET_HELD_KEYS" // keys whose responses are held after their order is committed
	listenEvent    = "listening http://"

	// fleetKeysEnv sets the number of keys of the fleet test (the long
	// run); it defaults to fleetKeys.
	fleetKeysEnv = "IDEM_REDIS_FLEET_KEYS"
	fleetKeys    = 60
)

func TestMain(m *testing.M) {
	if os.Getenv(replicaEnv) != "" {
		if err := replicaMain(); err != nil {
			fmt.Fprintln(os.Stderr, "replica:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// replicaMain runs the example (run, with the flags it was given) with its
// orders handler wrapped: each run appends "run TENANT KEY PID" to the exec
// log before anything else, and "done TENANT KEY PID STATUS ORDER" once the
// handler returned (its order committed), each in one O_APPEND write, so
// that the log counts the runs of every replica, the killed one included.
// A run of a key in IDEM_FLEET_HELD_KEYS is then held before the
// middleware stores its response: a SIGKILL in the hold leaves the key in
// progress with its order committed.
func replicaMain() error {
	flag.Parse()
	held := map[string]bool{}
	for k := range strings.SplitSeq(os.Getenv(replicaHeldEnv), ",") {
		held[k] = k != ""
	}
	execLog, err := os.OpenFile(os.Getenv(replicaLogEnv), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer execLog.Close()
	pid := os.Getpid()
	listening = func(addr string) { fmt.Printf("%s%s\n", listenEvent, addr) }
	routes = func(app *orders.App, mw *server.Middleware) http.Handler {
		logged := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tenant := orders.Tenant(r)
			key, _ := server.KeyFromContext(r.Context())
			if _, err := fmt.Fprintf(execLog, "run %s %s %d\n", tenant, key, pid); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			time.Sleep(rand.N(20 * time.Millisecond))
			rec := httptest.NewRecorder()
			app.Handler().ServeHTTP(rec, r)
			var o orders.Order
			_ = json.Unmarshal(rec.Body.Bytes(), &o)
			if o.ID == "" {
				o.ID = "-"
			}
			if _, err := fmt.Fprintf(execLog, "done %s %s %d %d %s\n", tenant, key, pid, rec.Code, o.ID); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if held[key] {
				<-r.Context().Done()
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
		return mux
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return run(ctx)
}

// replica is a running replica child.
type replica struct {
	name   string
	cmd    *exec.Cmd
	url    string
	done   chan struct{}
	err    error
	stderr bytes.Buffer
}

func startReplica(t *testing.T, name string, args []string, env ...string) *replica {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	r := &replica{name: name, done: make(chan struct{})}
	r.cmd = exec.Command(self, args...)
	r.cmd.Env = append(append(os.Environ(), replicaEnv+"=1"), env...)
	out, err := r.cmd.StdoutPipe()
	require.NoError(t, err)
	r.cmd.Stderr = &r.stderr
	require.NoError(t, r.cmd.Start())
	addr := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(io.TeeReader(out, &lineWatcher{addr: addr}))
		_ = b
	}()
	go func() { r.err = r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() { r.kill() })
	select {
	case a := <-addr:
		r.url = "http://" + a
	case <-r.done:
		t.Fatalf("%s exited before it listened: %v\n%s", name, r.err, r.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not listen within 30 s\n%s", name, r.stderr.String())
	}
	return r
}

func (r *replica) pid() int { return r.cmd.Process.Pid }

func (r *replica) kill() {
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.done
}

// stop asks the replica to shut down (SIGTERM) and returns how it exited.
func (r *replica) stop() error {
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
		return r.err
	case <-time.After(30 * time.Second):
		r.kill()
		return fmt.Errorf("%s did not exit within 30 s of SIGTERM", r.name)
	}
}

// lineWatcher hands over the address of the child's "listening" line.
type lineWatcher struct {
	buf  []byte
	addr chan string
	sent bool
}

func (w *lineWatcher) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for !w.sent {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		line := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		if a, ok := strings.CutPrefix(line, listenEvent); ok {
			w.addr <- a
			w.sent = true
		}
	}
	return len(p), nil
}

type tenantKey struct{ tenant, key string }

func (k tenantKey) String() string { return k.tenant + "/" + k.key }

// handlerRun is one run of the orders handler, as the exec log tells it.
type handlerRun struct {
	pid   int
	line  int
	done  bool
	code  int
	order string
}

// readRuns parses the exec log: every key's runs in the order they
// started, and the line of the test's kill marker (-1: none). A last line
// without its newline is still being written and is left for later.
func readRuns(path string) (map[tenantKey][]*handlerRun, int, error) {
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, 0, err
	}
	runs, killLine := map[tenantKey][]*handlerRun{}, -1
	lines := strings.Split(string(b), "\n")
	for i, line := range lines[:len(lines)-1] {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "kill":
			killLine = i
		case len(f) == 4 && f[0] == "run":
			pid, _ := strconv.Atoi(f[3])
			k := tenantKey{f[1], f[2]}
			runs[k] = append(runs[k], &handlerRun{pid: pid, line: i})
		case len(f) == 6 && f[0] == "done":
			pid, _ := strconv.Atoi(f[3])
			code, _ := strconv.Atoi(f[4])
			rs := runs[tenantKey{f[1], f[2]}]
			j := len(rs) - 1
			for j >= 0 && (rs[j].pid != pid || rs[j].done) {
				j--
			}
			if j < 0 {
				return nil, 0, fmt.Errorf("exec log line %d: done without its run: %q", i+1, line)
			}
			rs[j].done, rs[j].code, rs[j].order = true, code, f[5]
		default:
			return nil, 0, fmt.Errorf("exec log line %d: %q", i+1, line)
		}
	}
	return runs, killLine, nil
}

// tally counts what the senders saw.
type tally struct{ requests, created, replayed, conflicts, unavailable, connErrors atomic.Int64 }

// sendUntilCreated sends one key's order to the replicas, starting with
// replicas[first] and moving on round robin after a connection error, a
// 409 or a 5xx, until one answers 201, and returns the order's ID.
func sendUntilCreated(ctx context.Context, client *http.Client, replicas []*replica, first int, k tenantKey, body string, n *tally) (string, error) {
	last := ""
	for i := first; ; i = (i + 1) % len(replicas) {
		if ctx.Err() != nil {
			return "", fmt.Errorf("%s: no 201 before the deadline; last answer: %s", k, last)
		}
		n.requests.Add(1)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, replicas[i].url+"/orders", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(orders.TenantHeader, k.tenant)
		req.Header.Set("Idempotency-Key", k.key)
		resp, err := client.Do(req)
		var b []byte
		if err == nil {
			b, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		if err != nil {
			n.connErrors.Add(1)
			last = err.Error()
			time.Sleep(5 * time.Millisecond)
			continue
		}
		last = fmt.Sprintf("%s: %d %s", replicas[i].name, resp.StatusCode, b)
		switch {
		case resp.StatusCode == http.StatusCreated:
			n.created.Add(1)
			if resp.Header.Get("Idempotent-Replayed") == "true" {
				n.replayed.Add(1)
			}
			var o orders.Order
			if json.Unmarshal(b, &o) != nil || o.ID == "" {
				return "", fmt.Errorf("%s: 201 without an order: %s", k, last)
			}
			return o.ID, nil
		case resp.StatusCode == http.StatusConflict:
			n.conflicts.Add(1)
		case resp.StatusCode >= 500 && resp.Header.Get("Idempotent-Replayed") != "true":
			n.unavailable.Add(1)
		default:
			return "", fmt.Errorf("%s: unexpected answer %s", k, last)
		}
		time.Sleep(20*time.Millisecond + rand.N(30*time.Millisecond))
	}
}

// TestFleetOfReplicasRunsEachKeyOnce starts three replicas of the example
// (this binary run again as its main, with its flags) on one Redis (the
// machine's, a prefix of the test's own) and one orders file, and sends
// every key three times at once, each copy to a different replica first,
// retrying round robin until it gets a 201. Replica 1 holds the first two
// keys of each tenant after committing their orders, before their
// responses are stored; once it holds them all and has run a few other
// keys, the test SIGKILLs it amid the other keys' traffic. Every key must
// have one order in the orders table (its UNIQUE (tenant, idem_key)
// guard), every sender of a key must get that order, and the exec log
// must show one handler run per key, except for a key in flight in the
// killed replica: that one runs once more in a survivor once its lock went
// stale (-lock-timeout), and that run finds the order the killed run
// committed. IDEM_REDIS_FLEET_KEYS sets the number of keys (60).
func TestFleetOfReplicasRunsEachKeyOnce(t *testing.T) {
	const (
		heldPer  = 2
		killAmid = 5
	)
	total, lockTimeout := fleetKeys, 3*time.Second
	if v := os.Getenv(fleetKeysEnv); v != "" {
		var err error
		total, err = strconv.Atoi(v)
		require.NoError(t, err, "%s must be a number of keys", fleetKeysEnv)
		// Thousands of senders at once on two cores delay the lock's
		// renewals: a longer timeout keeps take-overs to the killed
		// replica's keys.
		lockTimeout = 10 * time.Second
	}
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Skipf("no Redis answers at 127.0.0.1:6379 (%v): start one with redis-server --port 6379 --save '' --appendonly no", err)
	}
	keyPrefix := fmt.Sprintf("idemtest:fleet:%d:%d:", os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() {
		iter := c.Scan(context.Background(), 0, keyPrefix+"*", 1000).Iterator()
		for iter.Next(context.Background()) {
			c.Del(context.Background(), iter.Val())
		}
	})

	dir := t.TempDir()
	ordersPath, execPath := filepath.Join(dir, "orders.db"), filepath.Join(dir, "exec.log")
	app, err := orders.New(ordersPath) // created before the replicas race to
	require.NoError(t, err)
	require.NoError(t, app.Close())

	tenants := []string{"acme", "globex", "initech"}
	var keys, held []tenantKey
	heldNames := []string{}
	for i := range (total + len(tenants) - 1) / len(tenants) {
		for _, tenant := range tenants {
			k := tenantKey{tenant, fmt.Sprintf("order-%05d", i)}
			keys = append(keys, k)
			if i < heldPer {
				held = append(held, k)
				if tenant == tenants[0] {
					heldNames = append(heldNames, k.key)
				}
			}
		}
	}
	args := []string{"-test.run=^$", "-addr", "127.0.0.1:0", "-redis", "127.0.0.1:6379", "-prefix", keyPrefix,
		"-data", dir, "-lock-timeout", lockTimeout.String()}
	env := replicaLogEnv + "=" + execPath
	replicas := []*replica{
		startReplica(t, "replica-0", args, env),
		startReplica(t, "replica-1", args, env, replicaHeldEnv+"="+strings.Join(heldNames, ",")),
		// One replica sends its scripts through the autopipeliner: the
		// fleet may mix both.
		startReplica(t, "replica-2", append(slices.Clone(args), "-autopipeline"), env),
	}
	victim := replicas[1]
	killed := victim.pid()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+time.Duration(total)*20*time.Millisecond)
	defer cancel()
	transport := &http.Transport{MaxIdleConnsPerHost: 512}
	client := &http.Client{Transport: transport, Timeout: time.Minute}
	t.Cleanup(transport.CloseIdleConnections)

	// The watcher tells each held key's other senders when replica 1 runs
	// it, so that replica 1 is the one that holds it, and the test when
	// replica 1 holds them all, committed, and has run killAmid other keys.
	startedInVictim := map[tenantKey]chan struct{}{}
	for _, k := range held {
		startedInVictim[k] = make(chan struct{})
	}
	watchErr := make(chan error, 1)
	go func() {
		watchErr <- func() error {
			for {
				runs, _, err := readRuns(execPath)
				if err != nil {
					return err
				}
				committed, others, othersStarted := 0, 0, 0
				for k, rs := range runs {
					inVictim := slices.ContainsFunc(rs, func(r *handlerRun) bool { return r.pid == killed })
					if ch := startedInVictim[k]; ch != nil {
						if inVictim {
							select {
							case <-ch:
							default:
								close(ch)
							}
						}
						if slices.ContainsFunc(rs, func(r *handlerRun) bool { return r.pid == killed && r.done }) {
							committed++
						}
						continue
					}
					othersStarted++
					if inVictim {
						others++
					}
				}
				if committed == len(held) && (others >= killAmid || othersStarted == len(keys)-len(held)) {
					return nil
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("replica 1 held %d of the %d keys when the test gave up (%d other keys ran there)", committed, len(held), others)
				case <-time.After(5 * time.Millisecond):
				}
			}
		}()
	}()

	var (
		n        tally
		mu       sync.Mutex
		got      = map[tenantKey][]string{}
		sendErrs []error
		wg       sync.WaitGroup
	)
	// The keys arrive over about a second and a half (longer in a long
	// run), before, during and after the kill.
	spread := max(1500*time.Millisecond/time.Duration(len(keys)), 2*time.Millisecond)
	began := time.Now()
	for i, k := range keys {
		body := fmt.Sprintf(`{"item":"book-%s-%s","quantity":%d}`, k.tenant, k.key, 1+i%7)
		designated := startedInVictim[k] != nil
		for s := range replicas {
			wg.Go(func() {
				switch {
				case designated && s != 1:
					select {
					case <-startedInVictim[k]:
					case <-ctx.Done():
					}
				case !designated:
					time.Sleep(time.Duration(i) * spread)
				}
				id, err := sendUntilCreated(ctx, client, replicas, s, k, body, &n)
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

	// The watcher returns once replica 1 holds its keys, or fails.
	if err := <-watchErr; err != nil {
		cancel()
		wg.Wait()
		require.NoError(t, err)
	}
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
	require.Empty(t, sendErrs, "every sender gets a 201")
	for _, r := range replicas {
		if r != victim {
			assert.NoError(t, r.stop(), "%s exits cleanly on SIGTERM: %s", r.name, r.stderr.String())
		}
	}
	var ee *exec.ExitError
	require.ErrorAs(t, victim.err, &ee)
	ws, _ := ee.Sys().(syscall.WaitStatus)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "replica 1 died of the SIGKILL: %v", victim.err)

	// One effect per key: the orders table.
	db, err := sql.Open("sqlite3", "file:"+ordersPath+"?mode=ro&_busy_timeout=10000")
	require.NoError(t, err)
	defer db.Close()
	rows, err := db.Query(`SELECT id, tenant, idem_key, item FROM orders`)
	require.NoError(t, err)
	orderOf, count := map[tenantKey]string{}, map[tenantKey]int{}
	for rows.Next() {
		var (
			id   int64
			k    tenantKey
			item string
		)
		require.NoError(t, rows.Scan(&id, &k.tenant, &k.key, &item))
		assert.Equal(t, fmt.Sprintf("book-%s-%s", k.tenant, k.key), item, "%s's order is its own", k)
		orderOf[k] = "ord_" + strconv.FormatInt(id, 10)
		count[k]++
	}
	require.NoError(t, rows.Err())
	require.NoError(t, rows.Close())
	assert.Len(t, count, len(keys), "an order for each key sent, and nothing else")
	for _, k := range keys {
		assert.Equal(t, 1, count[k], "%s has one order", k)
		if assert.Len(t, got[k], len(replicas), "every sender of %s got a 201", k) {
			for _, id := range got[k] {
				assert.Equal(t, orderOf[k], id, "every sender of %s got its one order", k)
			}
		}
	}

	// One run per key, but for a run the kill interrupted, and for runs
	// that failed (the handler answered 5xx, its transaction rolled back:
	// the middleware stores no 5xx, and the key runs again). Under heavy
	// load a run fails when its replica could not renew the key's lock in
	// time: the middleware cancels the handler's context before the lock
	// lapses and another replica may take the key over.
	runs, killLine, err := readRuns(execPath)
	require.NoError(t, err)
	handlerRuns, reruns, failed := 0, 0, 0
	for _, k := range keys {
		rs := runs[k]
		handlerRuns += len(rs)
		if len(rs) == 0 {
			assert.Fail(t, "a key never ran", "%s", k)
			continue
		}
		// The runs that may have had an effect: those that answered 201,
		// and those the kill interrupted.
		var effective []*handlerRun
		for _, r := range rs {
			switch {
			case !r.done:
				assert.Equal(t, killed, r.pid, "%s: a run that never returned was in the killed replica", k)
				effective = append(effective, r)
			case r.code == http.StatusCreated:
				assert.Equal(t, orderOf[k], r.order, "a run of %s answered the key's one order", k)
				effective = append(effective, r)
			default:
				failed++
				assert.Equal(t, "-", r.order, "%s: a run that failed (%d) answered no order", k, r.code)
			}
		}
		switch {
		case len(effective) == 2:
			reruns++
			first, second := effective[0], effective[1]
			assert.True(t, first.pid == killed && second.pid != killed && second.line > killLine,
				"%s ran twice: only a run in flight in the killed replica runs again, in a survivor, after the kill", k)
			if first.done {
				assert.Equal(t, first.order, second.order, "the second run of %s found the killed run's order", k)
			}
		case len(effective) > 2:
			assert.Fail(t, "a key ran more than twice", "%s ran %d times (pids %v)", k, len(effective), pids(effective))
		}
	}
	// The kill landed mid-request: every held key's order was committed in
	// replica 1, which died before storing its response.
	for _, k := range held {
		assert.True(t, slices.ContainsFunc(runs[k], func(r *handlerRun) bool { return r.pid == killed && r.done && r.code == http.StatusCreated }),
			"%s's order was committed in replica 1", k)
	}
	t.Logf("%d keys (%d tenants, %d held in replica 1), 3 senders each: %d requests, %d 201 (%d replayed), %d 409, %d 5xx, %d connection errors",
		len(keys), len(tenants), len(held), n.requests.Load(), n.created.Load(), n.replayed.Load(), n.conflicts.Load(), n.unavailable.Load(), n.connErrors.Load())
	t.Logf("handler runs: %d for %d keys; %d failed (5xx, rolled back); %d keys ran again after the kill; orders: %d; %.2f s from the first request to the last 201, %.2f s after the kill (lock timeout %s)",
		handlerRuns, len(keys), failed, reruns, len(count), finished.Sub(began).Seconds(), finished.Sub(killedAt).Seconds(), lockTimeout)
}

func pids(runs []*handlerRun) []int {
	p := make([]int, len(runs))
	for i, r := range runs {
		p[i] = r.pid
	}
	return p
}
