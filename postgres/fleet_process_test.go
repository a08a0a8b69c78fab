package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
)

// The environment of a "worker" child process.
const (
	workerOwnerEnv   = "IDEM_WORKER_OWNER"
	workerServerEnv  = "IDEM_WORKER_SERVER"  // the orders server's base URL
	workerLeaseEnv   = "IDEM_WORKER_LEASE"   // Config.LeaseDuration
	workerDoEnv      = "IDEM_WORKER_DO"      // how many operations of its own it sends with Do first
	workerAnswersEnv = "IDEM_WORKER_ANSWERS" // where it writes each Do's answer
)

func init() { children["worker"] = workerMain }

// workerMain is one worker of a fleet: it opens the shared journal on a
// pool of its own, sends operations of its own with Do (IDEM_WORKER_DO of
// them, each until it succeeds, writing every answer to
// IDEM_WORKER_ANSWERS), and then finishes whatever is unfinished (its own
// work, and that of workers that died) until nothing is left, as
// examples/fleet's workers do. What the database's faults make fail (the
// journal's open, a Resume) it does again, as a worker that must keep
// running would; each time it says so on stderr.
func workerMain() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	lease, err := time.ParseDuration(os.Getenv(workerLeaseEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", workerLeaseEnv, err)
	}
	owner := os.Getenv(workerOwnerEnv)
	var (
		closeJournal func()
		c            *idem.Client
	)
	for {
		var j *postgres.Journal
		if j, closeJournal, err = openChildJournal(ctx); err == nil {
			if c, err = newFleetClient(j, os.Getenv(workerServerEnv), owner, lease); err == nil {
				break
			}
			closeJournal()
		}
		if ctx.Err() != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "opening the journal: %v; again\n", err)
		time.Sleep(50 * time.Millisecond)
	}
	defer closeJournal()
	defer c.Close()
	if n := os.Getenv(workerDoEnv); n != "" {
		ops, err := strconv.Atoi(n)
		if err != nil {
			return fmt.Errorf("%s: %w", workerDoEnv, err)
		}
		if err := sendOwn(ctx, c, owner, ops, os.Getenv(workerAnswersEnv)); err != nil {
			return err
		}
	}
	for {
		rep, err := c.Resume(ctx, idem.ResumeWait())
		fmt.Printf("%+v\n", rep)
		if err == nil || ctx.Err() != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "resume: %v; again\n", err)
		time.Sleep(50 * time.Millisecond)
	}
}

// doAnswer is one answer of a worker's Do, as it writes it.
type doAnswer struct {
	ID     string `json:"id"`
	Owner  string `json:"owner"`
	Status int    `json:"status,omitempty"` // the Result's, on success
	// Kind is what the answer says: "ok", or the first sentinel the error
	// matches (see answerKind).
	Kind string `json:"kind"`
	Err  string `json:"err,omitempty"`
	At   int64  `json:"at"` // Unix nanoseconds, just after Do returned
}

// answerKind names what an answer of Do says, most specific first.
func answerKind(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, postgres.ErrCommitInDoubt):
		return "commit in doubt"
	case errors.Is(err, idem.ErrLeaseLost):
		return "lease lost"
	case errors.Is(err, idem.ErrOutcomeUnknown):
		return "outcome unknown"
	case errors.Is(err, idem.ErrNotSent):
		return "not sent"
	case errors.Is(err, idem.ErrRejected):
		return "rejected"
	}
	var oe *idem.OperationError
	if errors.As(err, &oe) {
		return "operation error"
	}
	return "other error"
}

// sendOwn sends ops operations of the worker's own with Do, two at a time,
// each again until it succeeds (as an application retries an error with
// the same operation ID), and appends every answer to the file at path,
// one JSON line in one write each.
func sendOwn(ctx context.Context, c *idem.Client, owner string, ops int, path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	ids := make(chan string)
	go func() {
		defer close(ids)
		for i := range ops {
			select {
			case ids <- fmt.Sprintf("%s-do-%02d", owner, i):
			case <-ctx.Done():
				return
			}
		}
	}()
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			errs <- func() error {
				for id := range ids {
					body, _ := json.Marshal(map[string]any{"item": id, "quantity": 1})
					for {
						res, err := c.Do(ctx, idem.Op{ID: id, Method: http.MethodPost, URL: "/orders",
							Header: http.Header{"Content-Type": {"application/json"}}, Body: body})
						a := doAnswer{ID: id, Owner: c.Owner(), Kind: answerKind(err), At: time.Now().UnixNano()}
						if err != nil {
							a.Err = err.Error()
						} else {
							a.Status = res.StatusCode
						}
						line, _ := json.Marshal(a)
						if _, werr := f.Write(append(line, '\n')); werr != nil {
							return werr
						}
						if err == nil || errors.Is(err, idem.ErrRejected) {
							break
						}
						if ctx.Err() != nil {
							return fmt.Errorf("%s: %w", id, err)
						}
						time.Sleep(20 * time.Millisecond)
					}
				}
				return nil
			}()
		}()
	}
	return errors.Join(<-errs, <-errs)
}

// newFleetClient is the client of every process of the fleet.
func newFleetClient(j idem.Journal, base, owner string, lease time.Duration) (*idem.Client, error) {
	return idem.New(idem.Config{
		Journal:           j,
		BaseURL:           base,
		Status:            idem.StatusEndpoint(base + "/idempotency"),
		Owner:             owner,
		LeaseDuration:     lease,
		ResumeConcurrency: 2,
		// A held answer is given up on after this, and asked for.
		AttemptTimeout: 2 * time.Second,
	})
}

// TestFleetOfWorkerProcesses: four worker processes share one journal and
// forty operations; the server holds some answers; worker-1 is SIGKILLed
// while operations it leased are on the wire. The three others take them
// over (within the journal's LivenessGrace while liveness is on; once their
// leases lapse when it is off) and finish everything: the server ran its handler once per
// operation and holds one order for each.
func TestFleetOfWorkerProcesses(t *testing.T) {
	// Its processes and schema are its own: it runs beside the other
	// parallel tests instead of before them (the variants under faults,
	// soaked one after another by .ci/run, stay out of the way).
	t.Parallel()
	for _, tc := range fleetCases {
		t.Run(tc.name, func(t *testing.T) { testFleet(t, plainDB(t), tc.liveness, tc.lease, 0) })
	}
}

var fleetCases = []struct {
	name     string
	liveness bool
	lease    time.Duration
}{
	{"liveness", true, 30 * time.Second},
	{"without liveness", false, 3 * time.Second},
}

// TestFleetOfWorkerProcessesUnderFaults is the fleet above while its
// database misbehaves: behind a proxy that injects faults one after another
// (every session cut, one session cut, a COMMIT's acknowledgement lost,
// replies delayed, connections refused) and on a server of the test's own
// that crashes and restarts, for as long as the workers run. Each worker
// also sends operations of its own with Do first. Nothing runs twice,
// nothing is lost, no operation of a live worker is taken over, and every
// answer of Do agrees with the journal (checkAnswers).
// IDEM_PG_FLEET_SOAK=N runs N rounds of each.
func TestFleetOfWorkerProcessesUnderFaults(t *testing.T) {
	rounds := soakRounds(t)
	for _, db := range []struct {
		name string
		open func(*testing.T) *fleetDB
	}{{"proxy faults", proxiedDB}, {"database restarts", crashingDB}} {
		for _, tc := range fleetCases {
			lease := tc.lease
			if !tc.liveness {
				// Without liveness a lease is all that keeps others off a
				// worker's operations: it must outlast the database's
				// restart, during which it cannot be renewed.
				lease = 10 * time.Second
			}
			t.Run(db.name+"/"+tc.name, func(t *testing.T) {
				var total fleetFigures
				for round := range rounds {
					ok := t.Run(fmt.Sprint("round ", round+1), func(t *testing.T) {
						total.add(testFleet(t, db.open(t), tc.liveness, lease, 6))
					})
					if !ok {
						break
					}
				}
				t.Logf("figures: %d round(s), %s", rounds, &total)
			})
		}
	}
}

// fleetFigures is what one run of a fleet test counted.
type fleetFigures struct {
	operations, answers, duplicates, lost, liveTakeOvers, lapsedTakeOvers, disagreements int
	answerKinds                                                                          map[string]int
	faults                                                                               map[string]int
}

func (f *fleetFigures) add(o fleetFigures) {
	f.operations += o.operations
	f.answers += o.answers
	f.duplicates += o.duplicates
	f.lost += o.lost
	f.liveTakeOvers += o.liveTakeOvers
	f.lapsedTakeOvers += o.lapsedTakeOvers
	f.disagreements += o.disagreements
	for k, n := range o.answerKinds {
		if f.answerKinds == nil {
			f.answerKinds = map[string]int{}
		}
		f.answerKinds[k] += n
	}
	for k, n := range o.faults {
		if f.faults == nil {
			f.faults = map[string]int{}
		}
		f.faults[k] += n
	}
}

func (f *fleetFigures) String() string {
	return fmt.Sprintf("%d operations, %d answers of Do %v; faults %v; duplicates %d, lost %d, live workers taken for gone %d (operations of live workers taken once their lease lapsed %d), answers that disagree with the journal %d",
		f.operations, f.answers, f.answerKinds, f.faults, f.duplicates, f.lost, f.liveTakeOvers, f.lapsedTakeOvers, f.disagreements)
}

func testFleet(t *testing.T, db *fleetDB, liveness bool, lease time.Duration, doOps int) fleetFigures {
	const operations = 40
	srv := testserver.Start(t)
	schema := db.schema
	var opts []postgres.Option
	if !liveness {
		opts = append(opts, postgres.WithoutLiveness())
	}
	j, err := postgres.OpenJournal(ctx, db.pool, append(opts, postgres.Schema(schema))...)
	require.NoError(t, err)
	defer j.Close()

	// Enqueue: journaled with their keys, not sent.
	app, err := newFleetClient(j, srv.URL, "enqueuer", lease)
	require.NoError(t, err)
	for i := range operations {
		body, _ := json.Marshal(map[string]any{"item": "book", "quantity": i + 1})
		_, err := app.Begin(ctx, idem.Op{ID: fmt.Sprintf("order-%02d", i), Method: http.MethodPost, URL: "/orders",
			Header: http.Header{"Content-Type": {"application/json"}}, Body: body})
		require.NoError(t, err)
	}
	require.NoError(t, app.Close())
	// The first eight requests to reach the server get their orders created
	// and their answers held until the client gives up.
	srv.InjectN(testserver.HoldPastTimeout, 8)

	answers := t.TempDir()
	env := func(owner string) []string {
		env := append(childJournalEnv(schema, liveness), workerOwnerEnv+"="+owner, workerServerEnv+"="+srv.URL,
			workerLeaseEnv+"="+lease.String())
		env = append(env, db.env()...)
		if doOps > 0 {
			env = append(env, workerDoEnv+"="+strconv.Itoa(doOps), workerAnswersEnv+"="+filepath.Join(answers, owner+".jsonl"))
		}
		return env
	}
	workers := make([]*childProc, 4)
	for i := range workers {
		name := fmt.Sprintf("worker-%d", i+1)
		workers[i] = startChild(t, "worker", name, nil, env(name)...)
	}
	stopFaults := db.injectFaults(t)

	// Kill worker-1 with operations of its own on the wire.
	ops := pgschema.Ident(schema) + ".operations"
	type leased struct {
		key     string
		expires int64
	}
	// worker-1's operations as last read; the database may not answer
	// right after the kill, while its faults go on.
	var mine []leased
	readMine := func() ([]leased, []string, error) {
		rows, err := db.pool.Query(ctx, `SELECT key, state, coalesce(lease_expires_at, 0) FROM `+ops+
			` WHERE lease_owner LIKE 'worker-1#%' AND state IN (1, 2, 3)`)
		if err != nil {
			return nil, nil, err
		}
		var (
			all      []leased
			inFlight []string
		)
		for rows.Next() {
			var (
				l     leased
				state int16
			)
			if err := rows.Scan(&l.key, &state, &l.expires); err != nil {
				rows.Close()
				return nil, nil, err
			}
			all = append(all, l)
			if idem.State(state) == idem.StateInFlight {
				inFlight = append(inFlight, l.key)
			}
		}
		return all, inFlight, rows.Err()
	}
	// An operation in flight for 100 ms has its answer held (a quick one
	// is answered in a millisecond or two): worker-1 is then sure to die
	// with it on the wire, whatever it does in between.
	deadline := time.Now().Add(time.Minute)
	inFlightSince := map[string]time.Time{}
	for {
		all, keys, err := readMine()
		if db.inject == nil {
			require.NoError(t, err)
		}
		held, now := false, time.Now()
		if err == nil {
			mine = all
			seen := map[string]time.Time{}
			for _, k := range keys {
				since, ok := inFlightSince[k]
				if !ok {
					since = now
				}
				seen[k] = since
				held = held || now.Sub(since) >= 100*time.Millisecond
			}
			inFlightSince = seen
		}
		if held {
			break
		}
		select {
		case <-workers[0].waited:
			t.Fatalf("worker-1 exited before it sent anything: %v\n%s", workers[0].err, workers[0].stderr)
		default:
		}
		require.True(t, time.Now().Before(deadline), "worker-1 sent nothing in a minute")
		time.Sleep(5 * time.Millisecond)
	}
	killed := time.Now()
	workers[0].kill()
	if all, _, err := readMine(); err == nil {
		mine = all
	}
	require.NotEmpty(t, mine, "worker-1 died holding operations")
	t.Logf("worker-1 was SIGKILLed holding %d operation(s)", len(mine))

	for _, w := range workers[1:] {
		select {
		case <-w.waited:
			require.NoError(t, w.err, "%s: %s", w.name, w.stderr)
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s did not finish in two minutes", w.name)
		}
	}
	faults := stopFaults()

	counts, err := j.Count(ctx)
	require.NoError(t, err)
	require.Len(t, counts, 1, "every operation is in one state: %v", counts)
	assert.Equal(t, idem.StateSucceeded, counts[0].State)
	journaled := counts[0].N
	if doOps == 0 {
		assert.Equal(t, operations, journaled)
	}
	assert.Equal(t, journaled, srv.TotalOrders(), "one order per operation")
	assert.Equal(t, journaled, srv.Executions(), "the handler ran once per operation")
	assert.Zero(t, srv.GuardedDuplicates(), "no second run needed the application's guard")

	var slowest time.Duration
	for _, l := range mine {
		evs, err := j.History(ctx, l.key)
		require.NoError(t, err)
		var took *idem.Event
		for i := range evs {
			if evs[i].Kind == idem.EventClaim && strings.Contains(evs[i].Detail, "taken over from worker-1#") {
				took = &evs[i]
			}
		}
		require.NotNil(t, took, "worker-1's %s was taken over: %v", l.key, evs)
		assert.Regexp(t, `^worker-[234]#`, took.Owner)
		expires := time.UnixMilli(l.expires)
		if liveness {
			assert.Contains(t, took.Detail, "its owner is gone")
			assert.True(t, took.At.Before(expires), "taken at %v, before worker-1's lease would have lapsed at %v", took.At, expires)
		} else {
			assert.Contains(t, took.Detail, "its lease lapsed")
			assert.False(t, took.At.Before(expires), "taken at %v, not before worker-1's lease lapsed at %v", took.At, expires)
		}
		slowest = max(slowest, took.At.Sub(killed))
	}
	t.Logf("worker-1's operations were all taken over within %v of the kill; %d orders, %d handler runs, %d status requests",
		slowest.Round(time.Millisecond), srv.TotalOrders(), srv.Executions(), srv.StatusRequests())

	fig := fleetFigures{operations: journaled, faults: faults.byKind,
		duplicates: max(srv.Executions()-journaled, srv.TotalOrders()-journaled, srv.GuardedDuplicates())}
	live, lapsed := liveTakeOvers(t, j, db.pool, schema, "worker-1")
	assert.Empty(t, live, "no live worker is taken for gone")
	fig.liveTakeOvers, fig.lapsedTakeOvers = len(live), len(lapsed)
	if len(lapsed) > 0 {
		t.Logf("operations of live workers taken once their leases lapsed: %v", lapsed)
		key, _, _ := strings.Cut(lapsed[0], " ")
		evs, err := j.History(ctx, key)
		require.NoError(t, err)
		for _, e := range evs {
			t.Logf("  %s v%d %v %s→%s attempt %d %s %q %q", key, e.Version, e.At.Format(time.StampMilli), e.From, e.To, e.Attempt, e.Owner, e.Detail, e.Error)
		}
	}
	if doOps > 0 {
		a := checkAnswers(t, j, answers, "worker-1", doOps)
		assert.Empty(t, a.lost, "every operation a Do answered for is journaled and succeeded")
		assert.Empty(t, a.disagree, "every answer of Do agrees with the journal")
		fig.answers, fig.answerKinds, fig.lost, fig.disagreements = a.n, a.kinds, len(a.lost), len(a.disagree)
	}
	t.Logf("faults injected: %s", faults)
	return fig
}

// liveTakeOvers returns every take-over in the journal of an operation
// whose owner was another worker than the one killed (named killed), and
// alive: those that judged it gone (live), and those that took an
// operation whose lease had lapsed (lapsed). A lease lapses on a live
// worker that could not renew it for its whole duration, or that left the
// operation unsettled (a Do's error, a Resume that gave up on it): a lapsed
// lease is anyone's, by design, and the answers of Do that checkAnswers
// checks say whether it cost a worker a true answer.
func liveTakeOvers(t *testing.T, j *postgres.Journal, pool *pgxpool.Pool, schema, killed string) (live, lapsed []string) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT key FROM `+pgschema.Ident(schema)+`.operations`)
	require.NoError(t, err)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for _, key := range keys {
		evs, err := j.History(ctx, key)
		require.NoError(t, err)
		for _, e := range evs {
			_, from, ok := strings.Cut(e.Detail, "taken over from ")
			if e.Kind != idem.EventClaim || !ok || strings.HasPrefix(from, killed+"#") || strings.HasPrefix(from, e.Owner+":") {
				continue
			}
			what := fmt.Sprintf("%s by %s at %v: %s", key, e.Owner, e.At, e.Detail)
			if strings.Contains(e.Detail, "its lease lapsed") {
				lapsed = append(lapsed, what)
			} else {
				live = append(live, what)
			}
		}
	}
	return live, lapsed
}

// answerCheck is what checkAnswers found.
type answerCheck struct {
	n        int
	kinds    map[string]int
	lost     []string
	disagree []string
}

// checkAnswers holds every answer of Do that the workers wrote to dir to
// the journal's final state. A success is an operation the journal holds
// as succeeded, with the same status. An error of the journal's (it could
// not be reached, or a write is in doubt: ErrCommitInDoubt) names the
// operation, by its ID or its key. An error that says where the operation is (an
// *idem.OperationError: ErrOutcomeUnknown, ErrNotSent, ...) is given while
// the journal holds no outcome for it: nothing settled it before the error
// was returned (an event's time is in milliseconds, hence the
// millisecond). Every operation of a worker that lived (every worker but
// killed) is journaled and succeeded, each with doOps of them, and so is
// every operation of the killed one that an answer says is journaled.
func checkAnswers(t *testing.T, j *postgres.Journal, dir, killed string, doOps int) answerCheck {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	require.NoError(t, err)
	byID := map[string][]doAnswer{}
	c := answerCheck{kinds: map[string]int{}}
	for _, path := range files {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
			if line == "" {
				continue
			}
			var a doAnswer
			require.NoError(t, json.Unmarshal([]byte(line), &a), "%s: %q", path, line)
			byID[a.ID] = append(byID[a.ID], a)
			c.kinds[a.Kind]++
			c.n++
		}
	}
	for w := 2; w <= 4; w++ {
		for i := range doOps {
			if id := fmt.Sprintf("worker-%d-do-%02d", w, i); byID[id] == nil {
				c.lost = append(c.lost, id+": never answered")
			}
		}
	}
	for id, as := range byID {
		rec, err := j.Lookup(ctx, "default", id)
		if errors.Is(err, idem.ErrNotFound) {
			for _, a := range as {
				if a.Kind != "commit in doubt" && a.Kind != "other error" {
					c.lost = append(c.lost, fmt.Sprintf("%s: answered %s (%s), and not journaled", id, a.Kind, a.Err))
					break
				}
			}
			if !strings.HasPrefix(id, killed+"-") {
				c.lost = append(c.lost, id+": a live worker's operation is not journaled")
			}
			continue
		}
		require.NoError(t, err)
		if rec.State != idem.StateSucceeded {
			c.lost = append(c.lost, fmt.Sprintf("%s: %s at the end", id, rec.State))
			continue
		}
		evs, err := j.History(ctx, rec.Key)
		require.NoError(t, err)
		var settled time.Time
		for _, e := range evs {
			if e.To == idem.StateSucceeded {
				settled = e.At
				break
			}
		}
		for _, a := range as {
			at := time.Unix(0, a.At)
			switch a.Kind {
			case "ok":
				if rec.Response == nil || rec.Response.StatusCode != a.Status {
					c.disagree = append(c.disagree, fmt.Sprintf("%s: Do answered %d; the journal holds %+v", id, a.Status, rec.Response))
				}
			case "commit in doubt", "other error":
				// The journal could not be reached, or could not say:
				// the error is the journal's, and says which operation,
				// by its ID or its key (a claim's error names the key).
				if !strings.Contains(a.Err, id) && !strings.Contains(a.Err, rec.Key) {
					c.disagree = append(c.disagree, fmt.Sprintf("%s: a journal error that names neither the operation nor its key: %s", id, a.Err))
				}
			default:
				if !settled.Add(time.Millisecond).After(at) {
					c.disagree = append(c.disagree, fmt.Sprintf("%s: Do answered %s at %v, after the journal settled it at %v: %s",
						id, a.Kind, at.Format(time.StampMicro), settled.Format(time.StampMicro), a.Err))
				}
			}
		}
	}
	slices.Sort(c.lost)
	slices.Sort(c.disagree)
	return c
}
