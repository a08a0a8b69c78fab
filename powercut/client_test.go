package powercut

// The client-side power-cut loop.
//
// A client process ("client", this test binary run again) drives a growing
// stream of orders through idem, its journal on the power-cut file system,
// against the orders service (ordersd: the server middleware and the orders
// table, its data on an ordinary disk: the truth), another process that
// runs for the whole loop and holds each request a random 0–5 ms before and
// after it commits the order. The parent cuts the client's power at random
// moments: it SIGKILLs the client (a tenth of the time during start-up,
// while the journal opens; otherwise 1 to 300 ms after it is ready,
// log-uniform), then cuts the file system's power (every write and
// directory entry not fsynced is lost; half of the cuts also tear the last
// unsynced write at a 512-byte boundary), and starts the next life on what
// is left, which runs Resume and goes on.
//
// After every cut the parent reads the journal as it survived, and the
// orders table, and counts:
//
//   - orders for a key the journal does not hold (or holds for another
//     operation): a request sent without a durable intent;
//   - operations the journal held after an earlier cut, or whose success a
//     life printed, missing now: an intent lost;
//   - operations whose success a life printed and which the journal now
//     holds unsettled: an outcome the cut took back (allowed: outcomes are
//     committed without waiting for their fsync), to be restored by the
//     next lives' status checks.
//
// After the cuts, lives without cuts settle everything, a last cut follows
// a clean close, and the parent checks: one order per operation under the
// key the journal holds, none for anything else, every operation
// succeeded, every printed success is one the journal holds with that key
// and the order the server has.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// clientLoop configures one run of the client-side loop.
type clientLoop struct {
	sync   string // "full" (the default journal) or "normal" (SQLiteSynchronousNormal)
	binary string // the client's binary: this test binary when empty
	// bite: the run exists to show that the loop finds lost intents; it
	// stops at the first cut that shows one, and checks nothing else.
	bite bool
	// walLimit, when set, is the journal's SQLiteWALLimit; the child then
	// marks in marks each durable commit that found the WAL truncated.
	walLimit int64
	marks    string
}

// clientFigures are what a run counted.
type clientFigures struct {
	seed                    uint64
	cuts, startupCuts, torn int
	cutFiles, cutEntries    int
	cutBytes                int64
	ops, orders, acks       int
	statusChecks            int
	ordersWithoutIntent     map[string]string // key → item: sent without a durable intent
	intentsLost             map[string]bool   // operations the journal held, or acknowledged, gone after a cut
	outcomesTakenBack       map[string]bool   // acknowledged, read unsettled after a cut
	restoredByStatus        int               // … of which settled again by a status check
	duplicates, lost, wrong int
	firstLossCut            int
	// lossesBesideRecords counts orders without a durable intent found at a
	// cut after which the journal still held records: a loss of the last
	// intents, not of a journal never synced at all.
	lossesBesideRecords      int
	wall                     time.Duration
	ackedNotHeld, ackedWrong int
}

func (f *clientFigures) String() string {
	return fmt.Sprintf("seed %d; cuts %d (%d during start-up, %d torn writes); dropped by the cuts: %d files' writes (%d bytes), %d directory entries; "+
		"operations %d, orders %d, acknowledgements %d, status checks %d; "+
		"orders without a durable intent %d (%d beside surviving records), intents lost %d (first at cut %d); outcomes taken back by a cut %d (restored by a status check %d); "+
		"duplicates %d, lost %d, orders under another key %d; acknowledgements the journal does not hold %d, that name another order %d; wall %s",
		f.seed, f.cuts, f.startupCuts, f.torn, f.cutFiles, f.cutBytes, f.cutEntries,
		f.ops, f.orders, f.acks, f.statusChecks,
		len(f.ordersWithoutIntent), f.lossesBesideRecords, len(f.intentsLost), f.firstLossCut, len(f.outcomesTakenBack), f.restoredByStatus,
		f.duplicates, f.lost, f.wrong, f.ackedNotHeld, f.ackedWrong, f.wall.Round(100*time.Millisecond))
}

func TestPowerCutClient(t *testing.T) {
	fig := runClientLoop(t, clientLoop{sync: "full"})
	t.Log("figures: " + fig.String())
	assertClientLoopKeptItsPromises(t, fig)
}

// assertClientLoopKeptItsPromises checks a run that is not a bite: nothing
// sent without a durable intent, nothing lost, duplicated or acknowledged
// wrongly, and cuts that did drop writes.
func assertClientLoopKeptItsPromises(t *testing.T, fig *clientFigures) {
	t.Helper()
	assert.Empty(t, fig.ordersWithoutIntent, "no order for a key the journal does not hold")
	assert.Empty(t, fig.intentsLost, "no intent lost")
	assert.Zero(t, fig.duplicates, "one order per operation")
	assert.Zero(t, fig.lost, "every operation has its order")
	assert.Zero(t, fig.wrong, "every order under its operation's key")
	assert.Zero(t, fig.ackedNotHeld, "every acknowledged success is in the journal")
	assert.Zero(t, fig.ackedWrong, "every acknowledged success is the order the server has")
	assert.Positive(t, fig.acks, "the lives acknowledged successes")
	assert.Positive(t, fig.cutFiles, "the cuts dropped unsynced writes")
}

// TestPowerCutBites runs the loop where the journal does not sync its
// intents, to show that the loop finds exactly the loss it exists to find:
// an order on the server for a key the journal lost.
func TestPowerCutBites(t *testing.T) {
	t.Run("synchronous-normal", func(t *testing.T) {
		fig := runClientLoop(t, clientLoop{sync: "normal", bite: true})
		t.Log("figures: " + fig.String())
		assert.NotEmpty(t, fig.ordersWithoutIntent, "with synchronous=NORMAL a cut loses intents whose requests were sent")
	})
	t.Run("ack-before-sync", func(t *testing.T) {
		bin := buildAckEarly(t)
		fig := runClientLoop(t, clientLoop{sync: "full", binary: bin, bite: true})
		t.Log("figures: " + fig.String())
		assert.NotEmpty(t, fig.ordersWithoutIntent, "a build that acknowledges intents before their fsync sends requests a cut forgets")
	})
}

// buildAckEarly builds this test binary with the build tag idem_ackearly:
// the journal's durable writes return before their fsync (see
// internal/sqlitefile/ackearly_on.go).
func buildAckEarly(t *testing.T) string {
	t.Helper()
	if err := usable(); err != nil {
		t.Skipf("FUSE cannot be used here (%v): the power-cut loops cannot run", err)
	}
	bin := filepath.Join(t.TempDir(), "powercut-ackearly.test")
	args := []string{"test", "-c", "-tags", "idem_ackearly", "-o", bin}
	if raceEnabled {
		args = append(args, "-race") // shares the build cache with this run
	}
	cmd := exec.Command("go", append(args, ".")...)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Run(), "building the client with -tags idem_ackearly")
	return bin
}

func runClientLoop(t *testing.T, cfg clientLoop) *clientFigures {
	started := time.Now()
	f := mountCutFS(t)
	rnd, seed := loopRand(t)
	fig := &clientFigures{seed: seed, ordersWithoutIntent: map[string]string{}, intentsLost: map[string]bool{},
		outcomesTakenBack: map[string]bool{}}
	disk := t.TempDir()
	ordersPath := filepath.Join(disk, "orders.db")
	server, url := startServer(t, "-store", filepath.Join(disk, "keys.db"), "-orders", ordersPath,
		"-jitter-before", "5ms", "-jitter-after", "5ms", "-seed", strconv.FormatUint(seed, 10))
	defer stopServer(t, server)
	journal := filepath.Join(f.Dir(), "journal.db")
	durable := filepath.Join(f.Backing(), "journal.db")
	env := func(extra ...string) []string {
		vars := []string{"PC_JOURNAL=" + journal, "PC_URL=" + url, "PC_SYNC=" + cfg.sync}
		if cfg.walLimit != 0 {
			vars = append(vars, "PC_WALLIMIT="+strconv.FormatInt(cfg.walLimit, 10), "PC_MARKS="+cfg.marks)
		}
		return append(vars, extra...)
	}

	next := 0
	held := map[string]string{} // operation → key, as journaled after a cut or acknowledged
	type ack struct{ order, key string }
	acks := map[string][]ack{}
	statusDone := map[string]bool{} // operations a status check found completed, since their outcome was taken back
	readLines := func(lines []string) {
		for _, line := range lines {
			fields := strings.Fields(line)
			switch {
			case len(fields) == 2 && fields[0] == "take":
				n, err := strconv.Atoi(fields[1])
				require.NoError(t, err)
				next = max(next, n+1)
			case len(fields) == 4 && fields[0] == "ok":
				acks[fields[1]] = append(acks[fields[1]], ack{order: fields[2], key: fields[3]})
				if _, ok := held[fields[1]]; !ok {
					held[fields[1]] = fields[3]
				}
				fig.acks++
			case len(fields) == 3 && fields[0] == "st":
				fig.statusChecks++
				if fields[2] == "completed" && fig.outcomesTakenBack[fields[1]] {
					statusDone[fields[1]] = true
				}
			case strings.HasPrefix(line, "fail"):
				t.Errorf("a life failed: %s", line)
			}
		}
	}

	cuts := loopCuts()
	for i := range cuts {
		life := startChild(t, cfg.binary, "client", env("PC_NEXT="+strconv.Itoa(next))...)
		if rnd.Float64() < 0.1 {
			time.Sleep(time.Duration(rnd.Int64N(int64(20 * time.Millisecond))))
			fig.startupCuts++
		} else if _, ok := life.waitFor("ready"); ok {
			time.Sleep(lifetime(rnd))
		}
		readLines(life.kill())
		var tear = rnd
		if rnd.IntN(2) == 0 {
			tear = nil
		}
		c, err := f.Cut(tear)
		require.NoError(t, err)
		fig.cuts++
		fig.cutFiles += c.Files
		fig.cutBytes += c.Bytes
		fig.cutEntries += c.Entries
		if c.Torn {
			fig.torn++
		}

		// What survived.
		recs := snapshotJournal(t, durable)
		byKey := map[string]string{}
		for id, r := range recs {
			byKey[r.key] = id
		}
		for id, key := range held {
			if r, ok := recs[id]; !ok || r.key != key {
				if !fig.intentsLost[id] && len(fig.intentsLost) < 5 {
					t.Logf("cut %d: operation %s (key %s) is gone from the journal", i+1, id, key)
				}
				fig.intentsLost[id] = true
			}
		}
		for id := range acks {
			if r, ok := recs[id]; ok && r.state != idem.StateSucceeded && !fig.outcomesTakenBack[id] {
				fig.outcomesTakenBack[id] = true
			}
		}
		for id, r := range recs {
			if _, ok := held[id]; !ok {
				held[id] = r.key
			}
		}
		for _, o := range readOrders(t, ordersPath) {
			if id, ok := byKey[o.key]; (!ok || id != o.item) && fig.ordersWithoutIntent[o.key] == "" {
				if len(fig.ordersWithoutIntent) < 5 { // the first few; the figures count them all
					t.Logf("cut %d: order %s for %s under key %s, which the journal does not hold for it", i+1, o.id, o.item, o.key)
				}
				fig.ordersWithoutIntent[o.key] = o.item
				if len(recs) > 0 {
					fig.lossesBesideRecords++
				}
			}
		}
		if (len(fig.ordersWithoutIntent) > 0 || len(fig.intentsLost) > 0) && fig.firstLossCut == 0 {
			fig.firstLossCut = i + 1
		}
		if cfg.bite && len(fig.ordersWithoutIntent) > 0 {
			fig.wall = time.Since(started)
			return fig
		}
	}
	if cfg.bite {
		fig.wall = time.Since(started)
		return fig
	}

	// Settle everything, without cuts; then a last cut after a clean close
	// must lose nothing that matters.
	settled := false
	for range 5 {
		life := startChild(t, cfg.binary, "client", env("PC_FINAL=1")...)
		lines, err := life.wait()
		readLines(lines)
		if err == nil && slices.Contains(lines, "settled") {
			settled = true
			break
		}
	}
	require.True(t, settled, "the lives without cuts settle every operation")
	_, err := f.Cut(nil)
	require.NoError(t, err)
	fig.restoredByStatus = len(statusDone)

	recs := snapshotJournal(t, durable)
	orders := readOrders(t, ordersPath)
	fig.ops, fig.orders = len(recs), len(orders)
	tally := tallyOrders(recs, orders)
	byItem := tally.byItem
	for _, o := range tally.unheld {
		if fig.ordersWithoutIntent[o.key] == "" {
			fig.ordersWithoutIntent[o.key] = o.item
		}
	}
	fig.duplicates, fig.lost, fig.wrong = tally.duplicates, tally.lost, tally.wrong
	for id, as := range acks {
		r, ok := recs[id]
		if !ok {
			fig.ackedNotHeld++
			continue
		}
		for _, a := range as {
			if a.key != r.key || len(byItem[id]) != 1 || byItem[id][0].id != a.order {
				fig.ackedWrong++
			}
		}
	}
	fig.wall = time.Since(started)
	return fig
}
