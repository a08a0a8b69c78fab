package sqlitefile

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var testSchema = []string{`CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT NOT NULL)`}

func openTest(t *testing.T, mod ...func(*Options)) *DB {
	t.Helper()
	o := Options{What: "test file", AppID: 0x74657374, Migrations: testSchema}
	for _, m := range mod {
		m(&o)
	}
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "t.db"), o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func put(k, v string) func(*Tx) error {
	return func(tx *Tx) error {
		_, err := tx.Exec(`INSERT INTO kv (k, v) VALUES (?, ?)`, k, v)
		return err
	}
}

func get(t *testing.T, db *DB, k string) (string, bool) {
	t.Helper()
	var v string
	err := db.Reader.QueryRow(`SELECT v FROM kv WHERE k = ?`, k).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false
	}
	require.NoError(t, err)
	return v, true
}

// syncLevel reads PRAGMA synchronous on the writer connection as it stands
// while a write of the given kind is being committed.
func syncLevel(t *testing.T, db *DB, durable bool) int {
	t.Helper()
	var level int
	mode := Deferred
	if durable {
		mode = Durable
	}
	require.NoError(t, db.Write(context.Background(), mode, func(tx *Tx) error {
		return tx.QueryRow(`PRAGMA synchronous`).Scan(&level)
	}))
	return level
}

// A durable write's transaction is committed at synchronous=NORMAL and its
// WAL fsynced before Write returns, as FULL would inside COMMIT; a deferred
// write's is not fsynced (the flusher does it later). Whether that fsync
// keeps the write through a power cut is shown by the powercut module.
func TestDurableWritesFsyncTheWALAndDeferredDoNot(t *testing.T) {
	t.Parallel()
	db := openTest(t, func(o *Options) { o.FlushInterval = time.Hour })
	syncs := func() int64 {
		db.walMu.Lock()
		defer db.walMu.Unlock()
		return db.walSyncs
	}
	assert.Equal(t, 1, syncLevel(t, db, true), "the writer runs at NORMAL")
	assert.EqualValues(t, 1, syncs(), "a durable write returns after its WAL is fsynced")
	assert.Equal(t, 1, syncLevel(t, db, false))
	assert.EqualValues(t, 1, syncs(), "a deferred write returns without an fsync")
	assert.Equal(t, 1, syncLevel(t, db, true))
	assert.EqualValues(t, 2, syncs(), "each durable write's commit is fsynced")
	s := db.Stats()
	assert.EqualValues(t, 2, s.DurableCommits)
	assert.EqualValues(t, 1, s.DeferredCommits)
}

func TestSyncNormalOptionCommitsEverythingWithNormal(t *testing.T) {
	t.Parallel()
	db := openTest(t, func(o *Options) { o.SyncNormal = true })
	assert.Equal(t, 1, syncLevel(t, db, true))
	assert.Equal(t, 1, syncLevel(t, db, false))
}

func TestDeferredWriteIsFlushedWithinInterval(t *testing.T) {
	t.Parallel()
	db := openTest(t, func(o *Options) { o.FlushInterval = 20 * time.Millisecond })
	require.NoError(t, db.Write(context.Background(), Deferred, put("a", "1")))
	v, ok := get(t, db, "a")
	require.True(t, ok, "a deferred write is visible as soon as Write returns")
	assert.Equal(t, "1", v)
	require.Eventually(t, func() bool { return db.Stats().Flushes >= 1 }, 5*time.Second, 5*time.Millisecond,
		"the WAL must be fsynced after a deferred commit")
	flushes := db.Stats().Flushes
	require.NoError(t, db.Write(context.Background(), Durable, put("b", "2")))
	time.Sleep(60 * time.Millisecond)
	assert.Equal(t, flushes, db.Stats().Flushes, "a durable commit needs no extra flush")
}

// block holds the group commit's leader inside a write until release is
// closed, so that the writes queued meanwhile form one batch.
func block(t *testing.T, db *DB) (release func(), done chan error) {
	t.Helper()
	started := make(chan struct{})
	gate := make(chan struct{})
	done = make(chan error, 1)
	go func() {
		done <- db.Write(context.Background(), Durable, func(tx *Tx) error {
			close(started)
			<-gate
			return nil
		})
	}()
	<-started
	return func() { close(gate) }, done
}

func waitQueued(t *testing.T, db *DB, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		db.queueMu.Lock()
		defer db.queueMu.Unlock()
		return len(db.queue) == n
	}, 5*time.Second, time.Millisecond)
}

func TestFailingWriteInBatchFailsOnlyItsCaller(t *testing.T) {
	t.Parallel()
	db := openTest(t)
	require.NoError(t, db.Write(context.Background(), Durable, put("taken", "x")))
	release, blocked := block(t, db)

	const n = 20
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = db.Write(context.Background(), Durable, func(tx *Tx) error {
				if err := put(fmt.Sprint("k", i), "v")(tx); err != nil {
					return err
				}
				if i%4 == 0 {
					// a second statement that fails: the first must be rolled back too
					return put("taken", "again")(tx)
				}
				return nil
			})
		}()
	}
	waitQueued(t, db, n)
	release()
	require.NoError(t, <-blocked)
	wg.Wait()

	for i := range n {
		_, stored := get(t, db, fmt.Sprint("k", i))
		if i%4 == 0 {
			assert.Error(t, errs[i], "write %d hit a UNIQUE constraint", i)
			assert.False(t, stored, "the failed write %d must leave nothing behind", i)
		} else {
			assert.NoError(t, errs[i], "write %d shared a batch with failing writes", i)
			assert.True(t, stored, "write %d must be committed", i)
		}
	}
	assert.GreaterOrEqual(t, db.Stats().MaxBatch, n, "the queued writes must have been committed as one batch")
}

func TestConcurrentDurableWritesShareCommits(t *testing.T) {
	t.Parallel()
	db := openTest(t)
	const writers, each = 64, 10
	var wg sync.WaitGroup
	var failed atomic.Int64
	start := make(chan struct{})
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range each {
				if err := db.Write(context.Background(), Durable, put(fmt.Sprint(w, "/", i), "v")); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Zero(t, failed.Load())
	s := db.Stats()
	assert.EqualValues(t, writers*each, s.Writes)
	// One fsync per write would make DurableCommits equal Writes. Writers
	// that arrive while a commit is being fsynced join the next one.
	assert.Less(t, s.DurableCommits, s.Writes/2, "group commit must share fsyncs: %+v", s)
}

func TestWriteCanceledBeforeItsTurnIsSkipped(t *testing.T) {
	t.Parallel()
	db := openTest(t)
	release, blocked := block(t, db)
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() { res <- db.Write(ctx, Durable, put("late", "v")) }()
	waitQueued(t, db, 1)
	cancel()
	release()
	require.NoError(t, <-blocked)
	assert.ErrorIs(t, <-res, context.Canceled)
	_, stored := get(t, db, "late")
	assert.False(t, stored)
}

func TestCloseCommitsAcceptedWritesAndRefusesNewOnes(t *testing.T) {
	t.Parallel()
	o := Options{What: "test file", AppID: 0x74657374, Migrations: testSchema}
	path := filepath.Join(t.TempDir(), "t.db")
	db, err := Open(context.Background(), path, o)
	require.NoError(t, err)
	release, blocked := block(t, db)
	res := make(chan error, 1)
	go func() { res <- db.Write(context.Background(), Deferred, put("queued", "v")) }()
	waitQueued(t, db, 1)
	closed := make(chan error, 1)
	go func() { closed <- db.Close() }()
	require.Eventually(t, func() bool { return db.ErrIfClosed() != nil }, 5*time.Second, time.Millisecond)
	assert.ErrorIs(t, db.Write(context.Background(), Durable, put("new", "v")), ErrClosed)
	release()
	require.NoError(t, <-blocked)
	require.NoError(t, <-res, "a write accepted before Close is committed")
	require.NoError(t, <-closed)

	db, err = Open(context.Background(), path, o)
	require.NoError(t, err)
	defer db.Close()
	_, stored := get(t, db, "queued")
	assert.True(t, stored)
	_, stored = get(t, db, "new")
	assert.False(t, stored)
}

func TestWALStaysBoundedUnderConstantReaders(t *testing.T) {
	if testing.Short() {
		t.Skip("writes ~40 MB of WAL")
	}
	t.Parallel()
	const limit = 1 << 20
	db := openTest(t, func(o *Options) { o.WALLimit = limit })
	ctx, stop := context.WithCancel(context.Background())
	var readers sync.WaitGroup
	var reads atomic.Int64
	for range 4 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for ctx.Err() == nil {
				var n int
				if err := db.Reader.QueryRowContext(ctx, `SELECT count(*) FROM kv`).Scan(&n); err == nil {
					reads.Add(1)
				}
			}
		}()
	}
	value := string(make([]byte, 2000))
	for i := range 10000 {
		require.NoError(t, db.Write(context.Background(), Deferred, put(fmt.Sprint(i), value)))
	}
	// Readers keep running: with the writes going on, the WAL must come
	// back under the limit. The loop is plain (not require.Eventually,
	// whose condition runs on another goroutine and may still be writing
	// when it gives up); its deadline is generous for a loaded machine.
	truncated := false
	for i, deadline := 0, time.Now().Add(60*time.Second); !truncated && time.Now().Before(deadline); i++ {
		require.NoError(t, db.Write(context.Background(), Deferred, put(fmt.Sprint("more-", i), "v")))
		fi, err := os.Stat(db.Path() + "-wal")
		truncated = err == nil && fi.Size() < limit
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	readers.Wait()
	assert.True(t, truncated, "the WAL must be truncated while readers are active")
	assert.Positive(t, reads.Load())
}

// Back-to-back writes never give a checkpoint from another connection a
// chance; the committer's own checkpoints must keep the WAL small anyway.
func TestWALStaysSmallUnderSustainedWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("writes ~100 MB of WAL")
	}
	t.Parallel()
	db := openTest(t)
	var largest atomic.Int64
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if fi, err := os.Stat(db.Path() + "-wal"); err == nil && fi.Size() > largest.Load() {
				largest.Store(fi.Size())
			}
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	value := string(make([]byte, 3000))
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3000 {
				assert.NoError(t, db.Write(context.Background(), Mode(i%3), put(fmt.Sprint(w, "/", i), value)))
			}
		}()
	}
	wg.Wait()
	close(done)
	<-sampled
	// 24,000 rows of 3 kB: over 70 MB went through the WAL.
	assert.Less(t, largest.Load(), int64(16<<20), "the WAL must be reused, not grow with the writes")
}

func TestOnRollbackRunsBeforeTheNextWrite(t *testing.T) {
	t.Parallel()
	var rollbacks atomic.Int32
	db := openTest(t, func(o *Options) { o.OnRollback = func() { rollbacks.Add(1) } })
	require.NoError(t, db.Write(context.Background(), Durable, put("a", "1")))
	assert.Zero(t, rollbacks.Load())
	require.Error(t, db.Write(context.Background(), Durable, put("a", "again")), "alone in its batch")
	seen := int32(-1)
	require.NoError(t, db.Write(context.Background(), Durable, func(tx *Tx) error {
		seen = rollbacks.Load() // on the committer's goroutine, before this write
		return nil
	}))
	assert.Equal(t, int32(1), seen)
}

// rawGet reads k through a connection of its own, as another process would.
func rawGet(t *testing.T, path, k string) (string, bool) {
	t.Helper()
	raw, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer raw.Close()
	var v string
	err = raw.QueryRow(`SELECT v FROM kv WHERE k = ?`, k).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false
	}
	require.NoError(t, err)
	return v, true
}

func TestBufferedWriteJoinsTheNextCommit(t *testing.T) {
	t.Parallel()
	db := openTest(t, func(o *Options) { o.LingerDelay = time.Hour })
	ctx := context.Background()
	require.NoError(t, db.Write(ctx, Buffered, put("outcome", "1")))
	s := db.Stats()
	assert.Zero(t, s.DurableCommits+s.DeferredCommits, "a buffered write returns before any commit")
	_, seen := rawGet(t, db.Path(), "outcome")
	assert.False(t, seen, "other connections see a buffered write only once it is committed")

	require.NoError(t, db.Write(ctx, Durable, put("intent", "2")))
	s = db.Stats()
	assert.EqualValues(t, 1, s.DurableCommits, "the durable write commits the buffered one with it: one fsync for both")
	assert.EqualValues(t, 2, s.Writes)
	for _, k := range []string{"outcome", "intent"} {
		_, seen := rawGet(t, db.Path(), k)
		assert.True(t, seen, k)
	}
}

func TestCommitBufferedMakesBufferedWritesReadable(t *testing.T) {
	t.Parallel()
	db := openTest(t, func(o *Options) { o.LingerDelay = time.Hour })
	ctx := context.Background()
	require.NoError(t, db.CommitBuffered(ctx), "nothing buffered: nothing to do")
	assert.Zero(t, db.Stats().DurableCommits+db.Stats().DeferredCommits)
	require.NoError(t, db.Write(ctx, Buffered, put("a", "1")))
	_, seen := get(t, db, "a")
	assert.False(t, seen, "the read pool sees only committed writes")
	require.NoError(t, db.CommitBuffered(ctx))
	v, seen := get(t, db, "a")
	assert.True(t, seen)
	assert.Equal(t, "1", v)
}

func TestBufferedWriteIsCommittedWithinLingerDelay(t *testing.T) {
	t.Parallel()
	db := openTest(t, func(o *Options) { o.LingerDelay = 5 * time.Millisecond })
	require.NoError(t, db.Write(context.Background(), Buffered, put("a", "1")))
	require.Eventually(t, func() bool {
		_, seen := rawGet(t, db.Path(), "a")
		return seen
	}, 5*time.Second, time.Millisecond, "a buffered write that no other write carries is committed after LingerDelay")
	// The transaction is committed with fsync (it was begun FULL, in case a
	// durable write joined it); the counter moves just after the commit.
	require.Eventually(t, func() bool { return db.Stats().DurableCommits == 1 }, 5*time.Second, time.Millisecond)
}

func TestBufferedWriteErrorReachesItsCallerOnly(t *testing.T) {
	t.Parallel()
	db := openTest(t, func(o *Options) { o.LingerDelay = time.Hour })
	ctx := context.Background()
	require.NoError(t, db.Write(ctx, Buffered, put("a", "1")))
	// A failing write, buffered or durable, alone in its batch but in a
	// transaction that already carries a buffered write: it is rolled back
	// to its savepoint, and the buffered write stays.
	err := db.Write(ctx, Buffered, put("a", "again"))
	require.Error(t, err, "the statement's error reaches the buffered write's caller")
	assert.Contains(t, err.Error(), "UNIQUE")
	require.Error(t, db.Write(ctx, Durable, put("a", "again")))
	require.NoError(t, db.Write(ctx, Durable, put("b", "2")))
	for k, want := range map[string]string{"a": "1", "b": "2"} {
		v, seen := rawGet(t, db.Path(), k)
		assert.True(t, seen, k)
		assert.Equal(t, want, v, k)
	}
	assert.Zero(t, db.Stats().LostBuffered)
}

func TestDeferredWriteCommitsBufferedOnesWithoutLingering(t *testing.T) {
	t.Parallel()
	db := openTest(t, func(o *Options) { o.LingerDelay = time.Hour })
	ctx := context.Background()
	require.NoError(t, db.Write(ctx, Buffered, put("a", "1")))
	require.NoError(t, db.Write(ctx, Deferred, put("b", "2")))
	for _, k := range []string{"a", "b"} {
		_, seen := rawGet(t, db.Path(), k)
		assert.True(t, seen, "a deferred write returns committed, with the buffered writes before it: %s", k)
	}
}

func TestMaxBatchOneCommitsBufferedWritesAtOnce(t *testing.T) {
	t.Parallel()
	db := openTest(t, func(o *Options) { o.MaxBatch = 1; o.LingerDelay = time.Hour })
	require.NoError(t, db.Write(context.Background(), Buffered, put("a", "1")))
	_, seen := rawGet(t, db.Path(), "a")
	assert.True(t, seen, "with MaxBatch 1 every write is its own transaction")
	assert.EqualValues(t, 1, db.Stats().DeferredCommits, "committed without fsync, as a deferred write")
}

func TestCloseCommitsBufferedWritesDurably(t *testing.T) {
	t.Parallel()
	o := Options{What: "test file", AppID: 0x74657374, Migrations: testSchema, LingerDelay: time.Hour}
	path := filepath.Join(t.TempDir(), "t.db")
	db, err := Open(context.Background(), path, o)
	require.NoError(t, err)
	require.NoError(t, db.Write(context.Background(), Buffered, put("a", "1")))
	require.NoError(t, db.Close())
	assert.EqualValues(t, 1, db.Stats().DurableCommits)
	_, seen := rawGet(t, path, "a")
	assert.True(t, seen, "Close commits what was buffered")
}

func TestBufferedWritesFromManyGoroutines(t *testing.T) {
	t.Parallel()
	db := openTest(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				mode := []Mode{Buffered, Durable, Deferred}[(w+i)%3]
				assert.NoError(t, db.Write(ctx, mode, put(fmt.Sprint(w, "/", i), "v")))
			}
		}()
	}
	wg.Wait()
	require.NoError(t, db.CommitBuffered(ctx))
	var n int
	require.NoError(t, db.Reader.QueryRow(`SELECT count(*) FROM kv`).Scan(&n))
	assert.Equal(t, 16*50, n)
	assert.Zero(t, db.Stats().LostBuffered)
}

// openWithFailingCommit opens a test file where failsAtCommit makes the
// next commit fail: a deferred foreign key is checked at COMMIT, so the
// write runs and the commit is refused.
func openWithFailingCommit(t *testing.T) *DB {
	t.Helper()
	schema := append(append([]string{}, testSchema...),
		`CREATE TABLE child (parent TEXT REFERENCES kv (k) DEFERRABLE INITIALLY DEFERRED)`)
	db := openTest(t, func(o *Options) { o.LingerDelay = time.Hour; o.Migrations = schema })
	_, err := db.writer.ExecContext(context.Background(), "PRAGMA foreign_keys=ON")
	require.NoError(t, err)
	return db
}

func failsAtCommit(tx *Tx) error {
	_, err := tx.Exec(`INSERT INTO child (parent) VALUES ('missing')`)
	return err
}

func TestBufferedWritesRolledBackByAFailedCommitAreRunAgain(t *testing.T) {
	t.Parallel()
	db := openWithFailingCommit(t)
	ctx := context.Background()
	var replays atomic.Int32
	require.NoError(t, db.Write(ctx, Buffered, func(tx *Tx) error {
		if tx.Replay() {
			replays.Add(1)
		}
		return put("a", "1")(tx)
	}))
	// The commit fails, and the whole transaction is rolled back, the
	// buffered write with it, although it had returned.
	err := db.Write(ctx, Durable, failsAtCommit)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "commit")
	_, seen := rawGet(t, db.Path(), "a")
	assert.False(t, seen)

	// The next transaction runs it again first.
	require.NoError(t, db.Write(ctx, Durable, put("b", "2")))
	assert.EqualValues(t, 1, replays.Load())
	for _, k := range []string{"a", "b"} {
		_, seen := rawGet(t, db.Path(), k)
		assert.True(t, seen, k)
	}
	s := db.Stats()
	assert.EqualValues(t, 1, s.Replayed)
	assert.Zero(t, s.LostBuffered)
}

func TestRolledBackBufferedWritesAreRunAgainWithoutAnotherWrite(t *testing.T) {
	t.Parallel()
	db := openWithFailingCommit(t)
	ctx := context.Background()
	require.NoError(t, db.Write(ctx, Buffered, put("a", "1")))
	require.Error(t, db.Write(ctx, Durable, failsAtCommit))
	require.Eventually(t, func() bool {
		_, seen := rawGet(t, db.Path(), "a")
		return seen
	}, 5*time.Second, 10*time.Millisecond, "the linger timer retries the rolled-back buffered write")
}

func TestReplayedWriteThatNoLongerAppliesIsCounted(t *testing.T) {
	t.Parallel()
	db := openWithFailingCommit(t)
	ctx := context.Background()
	require.NoError(t, db.Write(ctx, Buffered, func(tx *Tx) error {
		if tx.Replay() {
			return errors.New("the record changed meanwhile")
		}
		return put("a", "1")(tx)
	}))
	require.Error(t, db.Write(ctx, Durable, failsAtCommit))
	require.NoError(t, db.Write(ctx, Durable, put("b", "2")))
	assert.EqualValues(t, 1, db.Stats().LostBuffered)
	_, seen := rawGet(t, db.Path(), "a")
	assert.False(t, seen)
}

// A buffered write has returned before it is committed; a read its caller
// makes next commits it first (CommitBuffered), so it sees the write. The
// write must be marked buffered before its caller is answered: otherwise
// the caller's CommitBuffered may find nothing marked and return, and the
// read miss the write (CI's conformance run found that window).
func TestCommitBufferedRightAfterABufferedWriteSeesIt(t *testing.T) {
	t.Parallel()
	db := openTest(t)
	ctx := context.Background()
	// Another writer, so that the batch carrying a buffered write is often
	// led by another goroutine, which answers it before it commits.
	stop := make(chan struct{})
	var other sync.WaitGroup
	other.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			assert.NoError(t, db.Write(ctx, Deferred, put(fmt.Sprint("other", i), "v")))
		}
	})
	defer func() { close(stop); other.Wait() }()
	for i := range 1000 {
		k := fmt.Sprint("k", i)
		require.NoError(t, db.Write(ctx, Buffered, put(k, "v")))
		require.NoError(t, db.CommitBuffered(ctx))
		if _, ok := get(t, db, k); !ok {
			t.Fatalf("write %d: returned, CommitBuffered returned, and a read does not see it", i)
		}
	}
}

// A durable commit's fsync covers the deferred commits before it: the
// flusher has nothing left to sync for them.
func TestDurableCommitSparesTheFlushOfDeferredOnes(t *testing.T) {
	t.Parallel()
	db := openTest(t, func(o *Options) { o.FlushInterval = time.Hour })
	unsynced := func() bool {
		db.unsyncedMu.Lock()
		defer db.unsyncedMu.Unlock()
		return !db.unsyncedSince.IsZero()
	}
	require.NoError(t, db.Write(context.Background(), Deferred, put("a", "1")))
	assert.True(t, unsynced(), "a deferred commit is for the flusher to sync")
	require.NoError(t, db.Write(context.Background(), Durable, put("b", "2")))
	assert.False(t, unsynced(), "the durable commit's fsync synced the deferred one")
}
