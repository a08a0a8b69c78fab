package powercut

// The server-side power-cut loop.
//
// The orders service (ordersd) runs with the middleware's SQLite key store
// on the power-cut file system and the application's orders table on an
// ordinary disk (the truth). A client in the test process, its journal on
// an ordinary disk, drives a stream of orders through idem, eight at a
// time, each until it is settled. The parent cuts the server's power at
// random moments, 1 to 300 ms into each of its lives (log-uniform): it
// SIGKILLs ordersd, mid-request as often as not (the server holds every
// request 0–5 ms before and after it commits the order), cuts the file
// system's power (half of the cuts tearing the last unsynced write), and
// starts ordersd again at the same address on what is left, with a short
// lock timeout so that claims its dead life left in progress are taken
// over quickly. The client's retries and status checks carry on through
// it. After the cuts the client settles everything, and the parent checks:
// one order per operation, under the key the journal holds for it, no
// order for anything else, every operation succeeded, and every success the
// client saw names the order the server has.
//
// The orders table's UNIQUE guard would keep one order per key even if the
// key store forgot a key, so the loop also counts the handler's runs:
// ordersd appends "run", "done" and "answered" lines to an exec log on the
// ordinary disk (-exec-log), and the parent appends "cut N" to it once each
// life is dead, before its power is cut. A key may run again only in a
// later life, and only if no earlier run of it was answered: the run's
// claim was durable, so only a cut mid-run (its lock then going stale) lets
// a retry run it again. Two runs of a key in one life, or a run after one
// that was answered, is a key the store lost. Finally the server's power is
// cut once more after it stopped, and the store that is left must hold a
// completed entry for every operation the client saw succeed.
//
// TestPowerCutServerBites runs the same loop with ordersd built with the
// tag idem_ackearly (claims and completions acknowledged before their
// fsync) and must find keys forgotten that way.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/server/orders"
	"github.com/idemkit/idem/server"
)

func TestPowerCutServer(t *testing.T) {
	fig := runServerLoop(t, "")
	t.Log("figures: " + fig.String())
	assert.Equal(t, fig.ops, fig.recs)
	assert.Zero(t, fig.duplicates, "one order per operation")
	assert.Zero(t, fig.lost, "every operation succeeded, with its order")
	assert.Zero(t, fig.wrongKey, "every order under its operation's key")
	assert.Zero(t, fig.orphans, "no order for anything the journal does not hold")
	assert.Zero(t, fig.wrongAcks, "every success names the order the server has")
	assert.Empty(t, fig.fails, "no operation was refused")
	assert.Positive(t, fig.busyCuts, "cuts landed while requests were in flight")
	assert.Positive(t, fig.cutFiles, "the cuts dropped unsynced writes of the key store")
	assert.Equal(t, fig.recs, fig.execKeys, "every operation's key ran the handler")
	assert.Empty(t, fig.runTwiceInALife, "no key ran twice in one life of the server")
	assert.Empty(t, fig.runAfterAnswer, "no key ran again after a run of it was answered")
	assert.Empty(t, fig.completionsForgotten, "the store keeps every completion a client saw")
	assert.False(t, fig.timedOut, "the loop finished in its budget")
}

// TestPowerCutServerBites runs the server loop against an ordersd whose key
// store acknowledges claims and completions before their fsync (the build
// tag idem_ackearly, see internal/sqlitefile/ackearly_on.go), to show that
// the loop finds exactly what it exists to find: keys the store forgot.
func TestPowerCutServerBites(t *testing.T) {
	bin := buildAckEarly(t)
	fig := runServerLoop(t, bin)
	t.Log("figures: " + fig.String())
	assert.NotEmpty(t, len(fig.runTwiceInALife)+len(fig.runAfterAnswer)+len(fig.completionsForgotten),
		"a store that acknowledges before its fsync loses keys a cut takes back (seed %d)", fig.seed)
}

// serverFigures is what one server loop found.
type serverFigures struct {
	seed                                           uint64
	cuts, busyCuts, torn, cutFiles, cutEntries     int
	cutBytes                                       int64
	ops, recs, orders, acked, statusChecks         int
	fails                                          []string
	duplicates, lost, wrongKey, orphans, wrongAcks int
	execKeys, runs, reRunsAfterCut                 int
	runTwiceInALife, runAfterAnswer                []string // tenant/key
	completionsForgotten                           []string // operation IDs
	timedOut                                       bool
	wall                                           time.Duration
}

func (f *serverFigures) String() string {
	return fmt.Sprintf("seed %d; server power cuts %d (%d with operations in flight, %d torn writes); dropped by the cuts: %d files' writes (%d bytes), %d directory entries; "+
		"operations %d, orders %d, acknowledgements %d, status checks %d, rejections %d; "+
		"duplicates %d, lost %d, under another key %d, orders for no operation %d, acknowledgements naming another order %d; "+
		"exec log: keys %d, handler runs %d, re-runs after a cut %d, keys run twice in one life %d, keys run again after an answer %d; "+
		"completions the client saw and the store forgot %d; wall %s",
		f.seed, f.cuts, f.busyCuts, f.torn, f.cutFiles, f.cutBytes, f.cutEntries, f.recs, f.orders, f.acked, f.statusChecks, len(f.fails),
		f.duplicates, f.lost, f.wrongKey, f.orphans, f.wrongAcks,
		f.execKeys, f.runs, f.reRunsAfterCut, len(f.runTwiceInALife), len(f.runAfterAnswer),
		len(f.completionsForgotten), f.wall.Round(100*time.Millisecond))
}

// runServerLoop runs the server-side loop with ordersd run from binary
// (this test binary when empty).
func runServerLoop(t *testing.T, binary string) *serverFigures {
	started := time.Now()
	f := mountCutFS(t)
	rnd, seed := loopRand(t)
	fig := &serverFigures{seed: seed}
	disk := t.TempDir()
	ordersPath := filepath.Join(disk, "orders.db")
	execPath := filepath.Join(disk, "exec.log")
	execLog, err := os.OpenFile(execPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	require.NoError(t, err)
	defer execLog.Close()
	args := []string{"-store", filepath.Join(f.Dir(), "keys.db"), "-orders", ordersPath, "-exec-log", execPath,
		"-lock-timeout", "300ms", "-jitter-before", "5ms", "-jitter-after", "5ms", "-seed", strconv.FormatUint(seed, 10)}
	server, url := startServerBinary(t, binary, append(args, "-addr", "127.0.0.1:0")...)
	addr := strings.TrimPrefix(url, "http://")
	args = append(args, "-addr", addr)

	j, err := idem.OpenSQLite(filepath.Join(disk, "journal.db"))
	require.NoError(t, err)
	defer j.Close()
	var (
		mu           sync.Mutex
		acks         = map[string][]string{} // operation → the orders its successes named
		statusChecks int
		fails        []string
	)
	o := &out{sink: func(line string) {
		fields := strings.Fields(line)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case len(fields) == 4 && fields[0] == "ok":
			acks[fields[1]] = append(acks[fields[1]], fields[2])
		case fields[0] == "st":
			statusChecks++
		case fields[0] == "rejected":
			fails = append(fails, line)
		}
	}}
	c, err := idem.New(idem.Config{
		Journal: j, BaseURL: url,
		Status: printingStatus{next: idem.StatusEndpoint(url + "/idempotency"), out: o},
		Retry: idem.RetryPolicy{MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
			MaxRetryAfter: 50 * time.Millisecond, MaxAttempts: 5, MaxStatusChecks: 20, Budget: 10 * time.Second,
			RetryRatio: 1, MinRetriesPerSecond: 1000},
		AttemptTimeout: time.Second,
	})
	require.NoError(t, err)
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var (
		stop     atomic.Bool
		counter  atomic.Int64
		inFlight atomic.Int64 // operations inside Do
		wg       sync.WaitGroup
		driveErr atomic.Value
	)
	for range 8 {
		wg.Go(func() {
			for !stop.Load() {
				id := opID(int(counter.Add(1) - 1))
				inFlight.Add(1)
				err := drive(ctx, c, o, id)
				inFlight.Add(-1)
				if err != nil {
					driveErr.CompareAndSwap(nil, err)
					return
				}
			}
		})
	}

	fig.cuts = loopCuts()
	for i := range fig.cuts {
		time.Sleep(lifetime(rnd))
		if inFlight.Load() > 0 {
			fig.busyCuts++
		}
		server.kill()
		// The life is dead (reaped): every line it wrote is before this one.
		_, err := execLog.Write(fmt.Appendf(nil, "cut %d\n", i+1))
		require.NoError(t, err)
		var tear = rnd
		if rnd.IntN(2) == 0 {
			tear = nil
		}
		cut, err := f.Cut(tear)
		require.NoError(t, err)
		fig.cutFiles += cut.Files
		fig.cutBytes += cut.Bytes
		fig.cutEntries += cut.Entries
		if cut.Torn {
			fig.torn++
		}
		server, _ = startServerBinary(t, binary, args...)
	}
	stop.Store(true)
	wg.Wait()
	if err, _ := driveErr.Load().(error); err != nil {
		t.Fatalf("an operation could not be driven (seed %d): %v", seed, err)
	}
	// Whatever Do left unsettled, Resume then Do settle, the server up.
	_, err = c.Resume(ctx)
	require.NoError(t, err)
	var ops []string
	for rec, err := range j.List(ctx, idem.Filter{}) {
		require.NoError(t, err)
		ops = append(ops, rec.ID)
		if !rec.State.Terminal() {
			require.NoError(t, drive(ctx, c, o, rec.ID))
		}
	}
	stopServer(t, server)
	// One more cut once it stopped: what the store holds now is what it has
	// on disk.
	_, err = f.Cut(nil)
	require.NoError(t, err)

	recs := map[string]idem.Record{}
	held := map[string]record{}
	for rec, err := range j.List(ctx, idem.Filter{}) {
		require.NoError(t, err)
		recs[rec.ID] = rec
		held[rec.ID] = record{key: rec.Key, state: rec.State}
	}
	fig.ops, fig.recs = len(ops), len(recs)
	orders := readOrders(t, ordersPath)
	fig.orders = len(orders)
	tally := tallyOrders(held, orders)
	byItem := tally.byItem
	fig.orphans, fig.duplicates, fig.lost, fig.wrongKey = len(tally.unheld), tally.duplicates, tally.lost, tally.wrong
	for id, names := range acks {
		for _, name := range names {
			fig.acked++
			if len(byItem[id]) != 1 || byItem[id][0].id != name {
				fig.wrongAcks++
			}
		}
	}
	fig.statusChecks, fig.fails = statusChecks, fails
	checkExecLog(t, execPath, fig)
	fig.completionsForgotten = forgottenCompletions(t, filepath.Join(f.Backing(), "keys.db"), recs)
	fig.timedOut = errors.Is(ctx.Err(), context.DeadlineExceeded)
	fig.wall = time.Since(started)
	return fig
}

// checkExecLog reads the exec log and counts, per key, the handler's runs:
// a run after the key's first is a re-run after a cut when a "cut" line
// separates it from the previous run and no run of the key was answered
// before it; otherwise the store forgot the key (its claim within one life,
// or its completion after an answer).
func checkExecLog(t *testing.T, path string, fig *serverFigures) {
	t.Helper()
	file, err := os.Open(path)
	require.NoError(t, err)
	defer file.Close()
	type keyRuns struct {
		runs     int
		lastLife int // the life of the latest run
		answered bool
	}
	keys := map[string]*keyRuns{}
	life := 0
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) == 2 && fields[0] == "cut":
			life++
		case len(fields) >= 3 && fields[0] == "run":
			k := fields[1] + "/" + fields[2]
			kr := keys[k]
			if kr == nil {
				kr = &keyRuns{}
				keys[k] = kr
			}
			if kr.runs > 0 {
				switch {
				case kr.lastLife == life:
					fig.runTwiceInALife = append(fig.runTwiceInALife, k)
				case kr.answered:
					fig.runAfterAnswer = append(fig.runAfterAnswer, k)
				default:
					fig.reRunsAfterCut++
				}
			}
			kr.runs++
			kr.lastLife = life
			fig.runs++
		case len(fields) >= 3 && fields[0] == "answered":
			if kr := keys[fields[1]+"/"+fields[2]]; kr != nil {
				kr.answered = true
			}
		case len(fields) >= 4 && fields[0] == "done":
		default:
			t.Errorf("exec log: unexpected line %q", sc.Text())
		}
	}
	require.NoError(t, sc.Err())
	fig.execKeys = len(keys)
}

// forgottenCompletions opens a copy of the key store as the last cut left
// it and returns the operations that succeeded whose key it does not hold
// completed.
func forgottenCompletions(t *testing.T, durable string, recs map[string]idem.Record) []string {
	t.Helper()
	copyTo := filepath.Join(t.TempDir(), "keys.db")
	for _, suffix := range []string{"", "-wal"} {
		b, err := os.ReadFile(durable + suffix)
		if os.IsNotExist(err) {
			continue
		}
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(copyTo+suffix, b, 0o600))
	}
	var forgotten []string
	if _, err := os.Stat(copyTo); os.IsNotExist(err) {
		for id, r := range recs {
			if r.State == idem.StateSucceeded {
				forgotten = append(forgotten, id)
			}
		}
		return forgotten
	}
	store, err := server.OpenSQLiteStore(copyTo)
	require.NoError(t, err, "the key store opens after the cut")
	defer store.Close()
	for id, r := range recs {
		if r.State != idem.StateSucceeded {
			continue
		}
		e, err := store.Get(context.Background(), orders.DefaultTenant, r.Key, time.Now())
		if err != nil || e.State != server.Completed {
			forgotten = append(forgotten, id)
		}
	}
	return forgotten
}
