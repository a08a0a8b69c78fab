package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres/internal/pgproxy"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// soakEnv, set to a number N, runs the fleet tests under faults, N rounds
// each (see RELIABILITY.md). They take a minute and a half for one round,
// mostly waiting on leases and restarts, so the README's test command
// leaves them out; .ci/run runs them.
const soakEnv = "IDEM_PG_FLEET_SOAK"

// soakRounds is how many rounds each fleet test under faults runs; it
// skips the test when soakEnv is not set.
func soakRounds(t *testing.T) int {
	t.Helper()
	v := os.Getenv(soakEnv)
	if v == "" {
		t.Skipf("the fleet under faults runs when %s=N (N rounds, about 80 s each); .ci/run runs it", soakEnv)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a number of rounds, 1 or more", soakEnv, v)
	}
	return n
}

// fleetDB is the PostgreSQL a fleet test's processes reach, and what it
// does to them while they run: nothing, faults a proxy injects, or crashes
// and restarts.
type fleetDB struct {
	// dsn is what the processes connect to (their IDEM_TEST_POSTGRES).
	dsn string
	// pool is the test's own view of the same database, which no proxy
	// faults: it sets the run up and checks it.
	pool   *pgxpool.Pool
	schema string
	// inject injects faults until ctx ends, counting them in tally.
	inject func(ctx context.Context, rng *rand.Rand, tally *faultTally)
	// settle, if set, runs once inject returned: the database answers
	// again and whatever is still armed is counted.
	settle func(tally *faultTally)
}

// env is the environment that makes a child connect to the database.
func (d *fleetDB) env() []string {
	return []string{"IDEM_TEST_POSTGRES=" + d.dsn}
}

// plainDB is the tests' server, healthy.
func plainDB(t *testing.T) *fleetDB {
	return &fleetDB{dsn: pgtest.DSN(), pool: pgtest.Pool(t), schema: pgtest.Schema(t)}
}

// proxiedDB is the tests' server behind a proxy that, while the fleet
// runs, cuts every session, cuts one session, loses a COMMIT's
// acknowledgement (with and without the database going out of reach for a
// moment), delays replies and refuses connections for a while, one fault
// after another.
func proxiedDB(t *testing.T) *fleetDB {
	t.Helper()
	u, err := url.Parse(pgtest.DSN())
	require.NoError(t, err)
	p, err := pgproxy.Start(u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	u.Host = p.Addr().String()
	q := u.Query()
	q.Set("connect_timeout", "5")
	u.RawQuery = q.Encode()
	type armedFault struct {
		f    *pgproxy.Fault
		kind string
	}
	var armed []armedFault
	d := &fleetDB{dsn: u.String(), pool: pgtest.Pool(t), schema: pgtest.Schema(t)}
	d.inject = func(ctx context.Context, rng *rand.Rand, tally *faultTally) {
		for i := 0; ; i++ {
			if !pause(ctx, 150*time.Millisecond+rand.N(300*time.Millisecond)) {
				return
			}
			switch i % 6 {
			case 0:
				p.CutAll()
				tally.add("every session cut")
			case 1:
				if pids := p.BackendPIDs(); len(pids) > 0 && p.CutBackend(pids[rng.IntN(len(pids))]) {
					tally.add("one session cut")
				}
			case 2:
				armed = append(armed, armedFault{p.DropReply(commitsWrite), "COMMIT acknowledgement lost"})
			case 3:
				p.Delay(20 * time.Millisecond)
				pause(ctx, 400*time.Millisecond)
				p.Delay(0)
				tally.add("replies delayed 20 ms for 400 ms")
			case 4:
				p.Refuse(300 * time.Millisecond)
				tally.add("connections refused for 300 ms")
			case 5:
				armed = append(armed, armedFault{p.DropReplyAndRefuse(commitsWrite, 300*time.Millisecond),
					"COMMIT acknowledgement lost, database out of reach for 300 ms"})
			}
		}
	}
	d.settle = func(tally *faultTally) {
		p.Delay(0)
		p.Refuse(0)
		for _, a := range armed {
			if a.f.Fired() {
				tally.add(a.kind)
			}
		}
		// A fault that never met a COMMIT stays armed: it must not fire
		// while the test checks.
		p.CutAll()
	}
	return d
}

// crashingDB is a server of the test's own that crashes (pg_ctl stop -m
// immediate) and starts again while the fleet runs: soon after the fleet
// starts, and again every few seconds, each time once the fleet has run a
// while on the restarted server.
func crashingDB(t *testing.T) *fleetDB {
	t.Helper()
	db := pgtest.StartServer(t)
	return &fleetDB{dsn: db.DSN(), pool: checkedPool(t, db.DSN()), schema: "fleet",
		inject: func(ctx context.Context, rng *rand.Rand, tally *faultTally) {
			for wait := 300*time.Millisecond + rand.N(700*time.Millisecond); pause(ctx, wait); wait = 3*time.Second + rand.N(2*time.Second) {
				started := time.Now()
				db.Restart()
				tally.add("database crashed and restarted")
				tally.down(time.Since(started))
			}
		}}
}

// pause waits d, or until ctx ends; it reports whether ctx is still live.
func pause(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// faultTally counts the faults injected, by kind.
type faultTally struct {
	mu      sync.Mutex
	byKind  map[string]int
	longest time.Duration // the longest restart
}

func (f *faultTally) add(kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byKind == nil {
		f.byKind = map[string]int{}
	}
	f.byKind[kind]++
}

func (f *faultTally) down(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.longest = max(f.longest, d)
}

func (f *faultTally) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.byKind {
		n += c
	}
	return n
}

func (f *faultTally) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	kinds := make([]string, 0, len(f.byKind))
	for k := range f.byKind {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	var b strings.Builder
	for i, k := range kinds {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d %s", f.byKind[k], k)
	}
	if f.longest > 0 {
		fmt.Fprintf(&b, " (the longest restart took %v)", f.longest.Round(time.Millisecond))
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}

// injectFaults starts d's faults, if it has any; the returned stop ends
// them, waits until the database answers again, and returns what was
// injected.
func (d *fleetDB) injectFaults(t *testing.T) (stop func() *faultTally) {
	t.Helper()
	tally := &faultTally{}
	if d.inject == nil {
		return func() *faultTally { return tally }
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 22))
	go func() {
		defer close(done)
		d.inject(ctx, rng, tally)
	}()
	var once sync.Once
	stop = func() *faultTally {
		once.Do(func() {
			cancel()
			<-done
			if d.settle != nil {
				d.settle(tally)
			}
		})
		return tally
	}
	t.Cleanup(func() { stop() })
	return stop
}
