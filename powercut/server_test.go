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

import (
	"context"
	"errors"
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
)

func TestPowerCutServer(t *testing.T) {
	started := time.Now()
	f := mountCutFS(t)
	rnd, seed := loopRand(t)
	disk := t.TempDir()
	ordersPath := filepath.Join(disk, "orders.db")
	args := []string{"-store", filepath.Join(f.Dir(), "keys.db"), "-orders", ordersPath,
		"-lock-timeout", "300ms", "-jitter-before", "5ms", "-jitter-after", "5ms", "-seed", strconv.FormatUint(seed, 10)}
	server, url := startServer(t, append(args, "-addr", "127.0.0.1:0")...)
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

	cuts := loopCuts()
	var torn, busyCuts, cutFiles, cutEntries int
	var cutBytes int64
	for range cuts {
		time.Sleep(lifetime(rnd))
		if inFlight.Load() > 0 {
			busyCuts++
		}
		server.kill()
		var tear = rnd
		if rnd.IntN(2) == 0 {
			tear = nil
		}
		cut, err := f.Cut(tear)
		require.NoError(t, err)
		cutFiles += cut.Files
		cutBytes += cut.Bytes
		cutEntries += cut.Entries
		if cut.Torn {
			torn++
		}
		server, _ = startServer(t, args...)
	}
	stop.Store(true)
	wg.Wait()
	if err, _ := driveErr.Load().(error); err != nil {
		t.Fatalf("an operation could not be driven: %v", err)
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

	recs := map[string]idem.Record{}
	for rec, err := range j.List(ctx, idem.Filter{}) {
		require.NoError(t, err)
		recs[rec.ID] = rec
	}
	orders := readOrders(t, ordersPath)
	byItem := map[string][]order{}
	var orphans, duplicates, lost, wrongKey, wrongAcks int
	for _, od := range orders {
		byItem[od.item] = append(byItem[od.item], od)
		if r, ok := recs[od.item]; !ok || r.Key != od.key {
			orphans++
		}
	}
	for id, r := range recs {
		switch os := byItem[id]; {
		case len(os) > 1:
			duplicates++
		case len(os) == 0 || r.State != idem.StateSucceeded:
			lost++
		case os[0].key != r.Key:
			wrongKey++
		}
	}
	acked := 0
	for id, names := range acks {
		for _, name := range names {
			acked++
			if len(byItem[id]) != 1 || byItem[id][0].id != name {
				wrongAcks++
			}
		}
	}
	t.Logf("figures: seed %d; server power cuts %d (%d with operations in flight, %d torn writes); dropped by the cuts: %d files' writes (%d bytes), %d directory entries; "+
		"operations %d, orders %d, acknowledgements %d, status checks %d, rejections %d; "+
		"duplicates %d, lost %d, under another key %d, orders for no operation %d, acknowledgements naming another order %d; wall %s",
		seed, cuts, busyCuts, torn, cutFiles, cutBytes, cutEntries, len(recs), len(orders), acked, statusChecks, len(fails),
		duplicates, lost, wrongKey, orphans, wrongAcks, time.Since(started).Round(100*time.Millisecond))

	assert.Len(t, ops, len(recs))
	assert.Zero(t, duplicates, "one order per operation")
	assert.Zero(t, lost, "every operation succeeded, with its order")
	assert.Zero(t, wrongKey, "every order under its operation's key")
	assert.Zero(t, orphans, "no order for anything the journal does not hold")
	assert.Zero(t, wrongAcks, "every success names the order the server has")
	assert.Empty(t, fails, "no operation was refused")
	assert.Positive(t, busyCuts, "cuts landed while requests were in flight")
	assert.Positive(t, cutFiles, "the cuts dropped unsynced writes of the key store")
	assert.False(t, errors.Is(ctx.Err(), context.DeadlineExceeded), "the loop finished in its budget")
}
