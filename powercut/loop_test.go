package powercut

import (
	"bufio"
	"context"
	"database/sql"
	"flag"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/powercut/internal/cutfs"
)

var (
	cutsFlag = flag.Int("powercut.cuts", 0,
		"power cuts of each side's loop (default: $IDEM_POWERCUT_CUTS, else 50)")
	seedFlag = flag.Uint64("powercut.seed", 0,
		"seed of the loops' random choices (default: $IDEM_POWERCUT_SEED, else random; printed either way)")
)

// loopCuts is how many power cuts a loop makes.
func loopCuts() int {
	if *cutsFlag > 0 {
		return *cutsFlag
	}
	if n, err := strconv.Atoi(os.Getenv("IDEM_POWERCUT_CUTS")); err == nil && n > 0 {
		return n
	}
	return 50
}

// loopRand returns the loop's random source and prints its seed, so that a
// failing schedule of cuts can be run again (timing still differs: a seed
// names a schedule, not an interleaving).
func loopRand(t *testing.T) (*rand.Rand, uint64) {
	seed := *seedFlag
	if seed == 0 {
		seed, _ = strconv.ParseUint(os.Getenv("IDEM_POWERCUT_SEED"), 10, 64)
	}
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (repeat with IDEM_POWERCUT_SEED=%d)", seed, seed)
	return rand.New(rand.NewPCG(seed, seed^0x5deece66d)), seed
}

var usable = sync.OnceValue(cutfs.Usable)

// mountCutFS mounts a power-cut file system over a directory of its own,
// or skips the test where FUSE cannot be used.
func mountCutFS(t *testing.T) *cutfs.FS {
	t.Helper()
	if err := usable(); err != nil {
		t.Skipf("FUSE cannot be used here (%v): the power-cut loops cannot run", err)
	}
	dir := t.TempDir()
	backing := filepath.Join(dir, "disk")
	require.NoError(t, os.Mkdir(backing, 0o700))
	f, err := cutfs.Mount(filepath.Join(dir, "mnt"), backing, filepath.Join(dir, "stash"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.Unmount()) })
	return f
}

// proc is a child process whose stdout lines are collected.
type proc struct {
	cmd   *exec.Cmd
	lines chan string // closed at EOF
	all   []string
}

func startChild(t *testing.T, binary, name string, env ...string) *proc {
	t.Helper()
	cmd := childCommand(binary, name, env...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &proc{cmd: cmd, lines: make(chan string, 1024)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	return p
}

// waitFor reads lines until one starts with prefix, and returns it; false
// at EOF.
func (p *proc) waitFor(prefix string) (string, bool) {
	for line := range p.lines {
		p.all = append(p.all, line)
		if strings.HasPrefix(line, prefix) {
			return line, true
		}
	}
	return "", false
}

// kill SIGKILLs the child and returns every complete line it wrote.
func (p *proc) kill() []string {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	for line := range p.lines {
		p.all = append(p.all, line)
	}
	_ = p.cmd.Wait()
	return p.all
}

// wait waits for the child to end by itself and returns its lines and how
// it ended.
func (p *proc) wait() ([]string, error) {
	for line := range p.lines {
		p.all = append(p.all, line)
	}
	return p.all, p.cmd.Wait()
}

// startServer starts the orders service (ordersd) with args and returns
// it and its URL.
func startServer(t *testing.T, args ...string) (*proc, string) {
	t.Helper()
	return startServerBinary(t, "", args...)
}

// startServerBinary is startServer run from binary (this test binary when
// empty).
func startServerBinary(t *testing.T, binary string, args ...string) (*proc, string) {
	t.Helper()
	p := startChild(t, binary, "ordersd", "IDEM_POWERCUT_ARGS="+strings.Join(args, " "))
	line, ok := p.waitFor("listening ")
	if !ok {
		_, err := p.wait()
		t.Fatalf("ordersd did not start: %v", err)
	}
	return p, strings.TrimPrefix(line, "listening ")
}

// stopServer ends the orders service gracefully.
func stopServer(t *testing.T, p *proc) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	_, err := p.wait()
	require.NoError(t, err)
}

// lifetime draws how long a life runs before its power is cut:
// log-uniform between 1 and 300 ms.
func lifetime(rnd *rand.Rand) time.Duration {
	lo, hi := math.Log(float64(time.Millisecond)), math.Log(float64(300*time.Millisecond))
	return time.Duration(math.Exp(lo + rnd.Float64()*(hi-lo)))
}

// record is what a journal holds of one operation.
type record struct {
	key   string
	state idem.State
}

// snapshotJournal reads the journal at path as it would open after the cut:
// the files are copied out of the backing directory (what is durable) and
// opened there, so that the mount is not touched.
func snapshotJournal(t *testing.T, path string) map[string]record {
	t.Helper()
	dir := t.TempDir()
	copyTo := filepath.Join(dir, "journal.db")
	for _, suffix := range []string{"", "-wal"} {
		b, err := os.ReadFile(path + suffix)
		if os.IsNotExist(err) {
			continue
		}
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(copyTo+suffix, b, 0o600))
	}
	recs := map[string]record{}
	if _, err := os.Stat(copyTo); os.IsNotExist(err) {
		return recs // the journal itself did not survive (never synced)
	}
	j, err := idem.OpenSQLite(copyTo)
	require.NoError(t, err, "the journal opens after the cut")
	defer j.Close()
	for rec, err := range j.List(context.Background(), idem.Filter{}) {
		require.NoError(t, err)
		recs[rec.ID] = record{key: rec.Key, state: rec.State}
	}
	return recs
}

// order is a row of the orders table.
type order struct {
	id, key, item string
}

// orderTally compares the operations a journal holds at the end of a loop
// with the orders the server made.
type orderTally struct {
	byItem map[string][]order // the orders made for each operation
	unheld []order            // orders no operation holds under their key
	// Operations with more than one order, with none or not succeeded, and
	// with one under another key.
	duplicates, lost, wrong int
}

// tallyOrders makes the orderTally of the journal's operations, recs (by
// ID), and the server's orders.
func tallyOrders(recs map[string]record, orders []order) orderTally {
	tally := orderTally{byItem: map[string][]order{}}
	for _, o := range orders {
		tally.byItem[o.item] = append(tally.byItem[o.item], o)
		if r, ok := recs[o.item]; !ok || r.key != o.key {
			tally.unheld = append(tally.unheld, o)
		}
	}
	for id, r := range recs {
		switch os := tally.byItem[id]; {
		case len(os) > 1:
			tally.duplicates++
		case len(os) == 0 || r.state != idem.StateSucceeded:
			tally.lost++
		case os[0].key != r.key:
			tally.wrong++
		}
	}
	return tally
}

func readOrders(t *testing.T, path string) []order {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?_busy_timeout=10000")
	require.NoError(t, err)
	defer db.Close()
	rows, err := db.Query(`SELECT id, idem_key, item FROM orders ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	var out []order
	for rows.Next() {
		var id int64
		var o order
		require.NoError(t, rows.Scan(&id, &o.key, &o.item))
		o.id = "ord_" + strconv.FormatInt(id, 10)
		out = append(out, o)
	}
	require.NoError(t, rows.Err())
	return out
}
