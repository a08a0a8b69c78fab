package idem_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	_ "github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func openJournal(t *testing.T, path string, opts ...idem.SQLiteOption) *idem.SQLiteJournal {
	t.Helper()
	j, err := idem.OpenSQLite(path, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	return j
}

func TestSQLiteFilesAreCreatedPrivate(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	j := openJournal(t, path)
	_, _, err := j.Create(context.Background(), testRecord("s", "op-1", []byte("body")))
	require.NoError(t, err)
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "%s must be readable by its owner only", p)
	}
}

func TestSQLiteIsWALAndReopensWithData(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	j, err := idem.OpenSQLite(path)
	require.NoError(t, err)
	rec, _, err := j.Create(context.Background(), testRecord("s", "op-1", []byte("body")))
	require.NoError(t, err)
	require.NoError(t, j.Close())

	raw, err := sql.Open("sqlite3", path)
	require.NoError(t, err)
	var mode string
	require.NoError(t, raw.QueryRow("PRAGMA journal_mode").Scan(&mode))
	require.NoError(t, raw.Close())
	assert.Equal(t, "wal", mode)

	j = openJournal(t, path)
	got, err := j.Get(context.Background(), rec.Key)
	require.NoError(t, err)
	assert.Equal(t, rec, got)
}

// fileBytes reads a file so a test can prove a refused open changed nothing.
func fileBytes(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

func TestOpenSQLiteRefusesBadFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()

	foreign := filepath.Join(dir, "foreign.db")
	raw, err := sql.Open("sqlite3", foreign)
	require.NoError(t, err)
	_, err = raw.Exec(`CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO customers (name) VALUES ('a')`)
	require.NoError(t, err)
	require.NoError(t, raw.Close())

	text := filepath.Join(dir, "notes.txt")
	require.NoError(t, os.WriteFile(text, []byte(strings.Repeat("not a database. ", 200)), 0o600))

	newer := filepath.Join(dir, "newer.db")
	j, err := idem.OpenSQLite(newer)
	require.NoError(t, err)
	require.NoError(t, j.Close())
	raw, err = sql.Open("sqlite3", newer)
	require.NoError(t, err)
	_, err = raw.Exec(`PRAGMA user_version = 99`)
	require.NoError(t, err)
	require.NoError(t, raw.Close())

	notDir := filepath.Join(dir, "plain-file")
	require.NoError(t, os.WriteFile(notDir, nil, 0o600))

	cases := []struct {
		name, path string
		kind       error
		says       []string
	}{
		{"another program's database", foreign, idem.ErrNotJournal, []string{foreign, "not an idem journal", "another program"}},
		{"not SQLite at all", text, idem.ErrNotJournal, []string{text, "not an idem journal"}},
		{"newer schema", newer, idem.ErrSchemaTooNew, []string{newer, "99", "upgrade idem"}},
		{"a directory", dir, idem.ErrJournalPath, []string{dir, "is a directory", filepath.Join(dir, "idem.db")}},
		{"missing directory", filepath.Join(dir, "nope", "ops.db"), idem.ErrJournalPath, []string{"create the directory"}},
		{"parent is a file", filepath.Join(notDir, "ops.db"), idem.ErrJournalPath, []string{"not a directory"}},
		{"empty path", "", idem.ErrJournalPath, []string{"give the path"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var before []byte
			if fi, err := os.Stat(c.path); err == nil && fi.Mode().IsRegular() {
				before = fileBytes(t, c.path)
			}
			j, err := idem.OpenSQLite(c.path)
			if j != nil {
				j.Close()
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, c.kind)
			var fe *idem.FileError
			assert.True(t, errors.As(err, &fe), "the error is a *FileError")
			for _, s := range c.says {
				assert.Contains(t, err.Error(), s)
			}
			if before != nil {
				assert.Equal(t, before, fileBytes(t, c.path), "a refused file must be left exactly as it was")
				_, err := os.Stat(c.path + "-wal")
				assert.ErrorIs(t, err, os.ErrNotExist, "no WAL may be created next to a refused file")
			}
		})
	}
}

func TestOpenSQLiteMustExistNeverCreates(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "missing.db")
	_, err := idem.OpenSQLite(path, idem.SQLiteMustExist())
	require.Error(t, err)
	assert.ErrorIs(t, err, idem.ErrJournalPath)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.Contains(t, err.Error(), path)
	_, err = os.Stat(path)
	assert.ErrorIs(t, err, fs.ErrNotExist, "the file must not have been created")

	empty := filepath.Join(t.TempDir(), "empty.db")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	_, err = idem.OpenSQLite(empty, idem.SQLiteMustExist())
	require.ErrorIs(t, err, idem.ErrNotJournal, "an empty file is not adopted as a journal")
	assert.Empty(t, fileBytes(t, empty))

	openJournal(t, path).Close()
	j, err := idem.OpenSQLite(path, idem.SQLiteMustExist())
	require.NoError(t, err, "an existing journal opens")
	require.NoError(t, j.Close())
}

func TestOpenSQLiteRefusesUnwritablePath(t *testing.T) {
	t.Parallel()
	path := "/sys/idem-journal.db" // not writable even by root
	if os.Geteuid() != 0 {
		dir := t.TempDir()
		require.NoError(t, os.Chmod(dir, 0o500))
		t.Cleanup(func() { _ = os.Chmod(dir, 0o700) })
		path = filepath.Join(dir, "ops.db")
	} else if _, err := os.Stat("/sys"); err != nil {
		t.Skip("no /sys to stand for an unwritable directory")
	}
	_, err := idem.OpenSQLite(path)
	require.Error(t, err)
	assert.ErrorIs(t, err, idem.ErrJournalPath)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), "writable")
}

func TestSQLiteReportsCorruptFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	j, err := idem.OpenSQLite(path)
	require.NoError(t, err)
	for i := range 300 {
		_, _, err := j.Create(context.Background(), testRecord("s", fmt.Sprint("op-", i), []byte(strings.Repeat("x", 300))))
		require.NoError(t, err)
	}
	require.NoError(t, j.Close())

	// Overwrite every page but the first (the header and schema) with noise.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	fi, err := f.Stat()
	require.NoError(t, err)
	noise := make([]byte, fi.Size()-4096)
	for i := range noise {
		noise[i] = byte(i*7 + 3)
	}
	_, err = f.WriteAt(noise, 4096)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	j, err = idem.OpenSQLite(path)
	if err == nil {
		defer j.Close()
		for _, err = range j.List(context.Background(), idem.Filter{}) {
			if err != nil {
				break
			}
		}
	}
	require.Error(t, err, "a damaged journal must not read as healthy")
	assert.ErrorIs(t, err, idem.ErrJournalCorrupt)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), "restore a backup")
}

func TestSQLiteSynchronousNormalIsOptIn(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	full := openJournal(t, filepath.Join(dir, "full.db"))
	normal := openJournal(t, filepath.Join(dir, "normal.db"), idem.SQLiteSynchronousNormal())
	for _, j := range []*idem.SQLiteJournal{full, normal} {
		_, _, err := j.Create(context.Background(), testRecord("s", "op", nil))
		require.NoError(t, err)
	}
	assert.EqualValues(t, 1, full.Stats().DurableCommits, "by default an intent is committed durably")
	assert.EqualValues(t, 1, normal.Stats().DurableCommits)
}

// An intent (Create, a move into in_flight) waits for its fsync; an outcome
// recorded over in_flight does not, and is flushed soon after.
func TestSQLiteIntentIsDurableOutcomeIsDeferred(t *testing.T) {
	t.Parallel()
	j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"), idem.SQLiteFlushInterval(20*time.Millisecond))
	ctx := context.Background()
	rec, _, err := j.Create(ctx, testRecord("s", "op", []byte("{}")))
	require.NoError(t, err)
	rec.State = idem.StateInFlight
	rec.Attempts = 1
	rec, err = j.Update(ctx, rec, idem.Durable, idem.Event{})
	require.NoError(t, err)
	s := j.Stats()
	assert.EqualValues(t, 2, s.DurableCommits)
	assert.Zero(t, s.DeferredCommits)

	rec.State = idem.StateSucceeded
	rec.Response = &idem.Response{StatusCode: 201, Body: []byte(`{"id":1}`)}
	_, err = j.Update(ctx, rec, idem.Deferred, idem.Event{})
	require.NoError(t, err)
	s = j.Stats()
	assert.EqualValues(t, 2, s.DurableCommits, "the outcome must not cost an fsync")
	assert.EqualValues(t, 1, s.DeferredCommits)
	got, err := j.Get(ctx, rec.Key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, got.State, "a deferred write is visible at once")
	require.Eventually(t, func() bool { return j.Stats().Flushes > 0 }, 5*time.Second, 5*time.Millisecond,
		"the deferred outcome must be fsynced within the flush interval")
}

// rawState reads a record's state through a connection of its own, as
// another process (or a restart) would see it.
func rawState(t *testing.T, path, key string) idem.State {
	t.Helper()
	raw, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer raw.Close()
	u := uuid.MustParse(key)
	var state idem.State
	require.NoError(t, raw.QueryRow(`SELECT state FROM operations WHERE key = ?`, u[:]).Scan(&state))
	return state
}

func TestSQLiteBufferedOutcomeSharesTheNextIntentsFsync(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	j := openJournal(t, path, idem.SQLiteLingerDelay(time.Hour))
	ctx := context.Background()
	first := testRecord("s", "op-1", []byte("{}"))
	first.State, first.Attempts = idem.StateInFlight, 1
	rec, _, err := j.Create(ctx, first)
	require.NoError(t, err)
	assert.EqualValues(t, 1, j.Stats().DurableCommits, "an intent returns on disk")

	rec.State = idem.StateSucceeded
	rec.Response = &idem.Response{StatusCode: 201, Body: []byte(`{"id":1}`)}
	_, err = j.Update(ctx, rec, idem.Buffered, idem.Event{})
	require.NoError(t, err)
	s := j.Stats()
	assert.EqualValues(t, 1, s.DurableCommits+s.DeferredCommits, "a buffered outcome returns before any commit")
	assert.Equal(t, idem.StateInFlight, rawState(t, path, rec.Key), "not committed yet: a crash now would leave in_flight")

	second := testRecord("s", "op-2", []byte("{}"))
	second.State, second.Attempts = idem.StateInFlight, 1
	_, _, err = j.Create(ctx, second)
	require.NoError(t, err)
	s = j.Stats()
	assert.EqualValues(t, 2, s.DurableCommits, "the next intent's commit carries the outcome: one fsync each")
	assert.Zero(t, s.DeferredCommits)
	assert.Equal(t, idem.StateSucceeded, rawState(t, path, rec.Key))
}

// testRecord is a valid new pending record whose fingerprint is derived
// from its body.
func testRecord(scope, id string, body []byte) idem.Record {
	sum := sha256.Sum256(body)
	return idem.Record{
		Key: uuid.NewString(), Scope: scope, ID: id, Method: "POST", URL: "http://127.0.0.1/orders",
		Body: body, Fingerprint: hex.EncodeToString(sum[:]), KeyHeader: "Idempotency-Key", State: idem.StatePending,
	}
}

func init() {
	children["journal-hammer"] = childHammer
	children["journal-ack"] = childAck
}

// hammerReport is what a hammer child prints on stdout.
type hammerReport struct {
	Errors        []string
	SharedCreated int
	OwnCreated    int
	Increments    map[string]int
	Claimed       []string
}

// childHammer creates, transitions and claims records on a journal shared
// with another process, and reports what it was acknowledged.
func childHammer() error {
	j, err := idem.OpenSQLite(os.Getenv("IDEM_JOURNAL"))
	if err != nil {
		return err
	}
	defer j.Close()
	worker := os.Getenv("IDEM_WORKER")
	var counters []string
	if err := json.Unmarshal([]byte(os.Getenv("IDEM_COUNTERS")), &counters); err != nil {
		return err
	}
	var start int64
	if _, err := fmt.Sscan(os.Getenv("IDEM_START"), &start); err != nil {
		return err
	}
	time.Sleep(time.Until(time.UnixMilli(start))) // both processes begin together
	ctx := context.Background()
	rep := hammerReport{Increments: map[string]int{}}
	fail := func(err error) { rep.Errors = append(rep.Errors, err.Error()) }
	deadline := time.Now().Add(2 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		// create-or-get on IDs both processes use
		if _, created, err := j.Create(ctx, testRecord("shared", fmt.Sprint("op-", i%150), []byte("same"))); err != nil {
			fail(err)
		} else if created {
			rep.SharedCreated++
		}
		if _, _, err := j.Create(ctx, testRecord(worker, fmt.Sprint("op-", i), []byte("own"))); err != nil {
			fail(err)
		} else {
			rep.OwnCreated++
		}
		// compare-and-swap increments of a shared counter
		key := counters[i%len(counters)]
		for {
			rec, err := j.Get(ctx, key)
			if err != nil {
				fail(err)
				break
			}
			rec.Attempts++
			if _, err = j.Update(ctx, rec, []idem.Durability{idem.Deferred, idem.Buffered}[i%2], idem.Event{}); err == nil {
				rep.Increments[key]++
				break
			}
			if !errors.Is(err, idem.ErrConflict) {
				fail(err)
				break
			}
		}
		// claims, settled by their holder
		claimed, err := j.Claim(ctx, idem.ClaimRequest{Owner: worker, Limit: 1, Lease: time.Hour, Scope: "claim"})
		if err != nil {
			fail(err)
		}
		for _, rec := range claimed {
			rep.Claimed = append(rep.Claimed, rec.Key)
			rec.State = idem.StateCanceled
			if _, err := j.Update(ctx, rec, idem.Buffered, idem.Event{}); err != nil {
				fail(err)
			}
		}
	}
	return json.NewEncoder(os.Stdout).Encode(rep)
}

func TestSQLiteTwoProcessesShareOneJournal(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two processes for two seconds")
	}
	t.Parallel()
	path := filepath.Join(t.TempDir(), "shared.db")
	j := openJournal(t, path)
	ctx := context.Background()
	var counters []string
	for i := range 5 {
		rec, _, err := j.Create(ctx, testRecord("counter", fmt.Sprint(i), nil))
		require.NoError(t, err)
		counters = append(counters, rec.Key)
	}
	const claimable = 1000
	for i := range claimable {
		_, _, err := j.Create(ctx, testRecord("claim", fmt.Sprint(i), nil))
		require.NoError(t, err)
	}
	counterJSON, _ := json.Marshal(counters)

	start := fmt.Sprint("IDEM_START=", time.Now().Add(time.Second).UnixMilli())
	reports := make([]hammerReport, 2)
	var wg sync.WaitGroup
	for w := range reports {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := childCommand(t, "journal-hammer", "IDEM_JOURNAL="+path, fmt.Sprint("IDEM_WORKER=w", w),
				"IDEM_COUNTERS="+string(counterJSON), start)
			out, err := cmd.Output()
			assert.NoError(t, err)
			assert.NoError(t, json.Unmarshal(out, &reports[w]), "child output: %s", out)
		}()
	}
	wg.Wait()

	shared, claimedBy := 0, map[string]int{}
	for w, rep := range reports {
		incs := 0
		for _, n := range rep.Increments {
			incs += n
		}
		t.Logf("worker %d: %d shared creates, %d own creates, %d increments, %d claims, %d errors",
			w, rep.SharedCreated, rep.OwnCreated, incs, len(rep.Claimed), len(rep.Errors))
		assert.Empty(t, rep.Errors, "worker %d saw errors (SQLITE_BUSY must never reach a caller)", w)
		shared += rep.SharedCreated
		n := 0
		for range j.List(ctx, idem.Filter{Scope: fmt.Sprint("w", w)}) {
			n++
		}
		assert.Equal(t, rep.OwnCreated, n, "every acknowledged create of worker %d is in the journal", w)
		for _, k := range rep.Claimed {
			claimedBy[k]++
		}
	}
	nShared := 0
	for range j.List(ctx, idem.Filter{Scope: "shared"}) {
		nShared++
	}
	assert.Equal(t, nShared, shared, "each shared operation was created exactly once across both processes")
	for _, key := range counters {
		rec, err := j.Get(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, reports[0].Increments[key]+reports[1].Increments[key], rec.Attempts,
			"no acknowledged compare-and-swap may be lost")
	}
	for k, n := range claimedBy {
		assert.Equal(t, 1, n, "record %s was claimed by both processes", k)
	}
	canceled := 0
	for range j.List(ctx, idem.Filter{Scope: "claim", States: []idem.State{idem.StateCanceled}}) {
		canceled++
	}
	assert.Equal(t, len(claimedBy), canceled)
	assert.Positive(t, len(claimedBy))
	assert.Positive(t, reports[0].Increments[counters[0]]+reports[1].Increments[counters[0]])
}

// childAck creates records as fast as it can and prints each key once
// Create has returned, until it is killed.
// childAck does what Client.Do does to the journal, in a loop: a durable
// Create of an in_flight record, acknowledged on stdout once it returns,
// then a buffered Update to succeeded. A buffered write is not on disk when
// it returns; it is once the next durable write has returned, so its
// settlement is acknowledged after the next Create.
func childAck() error {
	j, err := idem.OpenSQLite(os.Getenv("IDEM_JOURNAL"))
	if err != nil {
		return err
	}
	ctx := context.Background()
	out := bufio.NewWriter(os.Stdout)
	settled := ""
	for i := 0; ; i++ {
		id := fmt.Sprint("op-", i)
		rec := testRecord("s", id, []byte("body of "+id))
		rec.State, rec.Attempts = idem.StateInFlight, 1
		rec, _, err := j.Create(ctx, rec)
		if err != nil {
			return err
		}
		fmt.Fprintln(out, "created", rec.Key, id)
		if settled != "" {
			fmt.Fprintln(out, "settled", settled)
		}
		if err := out.Flush(); err != nil {
			return err
		}
		rec.State = idem.StateSucceeded
		rec.Response = &idem.Response{StatusCode: 201, Body: []byte("order for " + id)}
		if _, err := j.Update(ctx, rec, idem.Buffered, idem.Event{}); err != nil {
			return err
		}
		settled = id
	}
}

func TestSQLiteAcknowledgedWritesSurviveSIGKILL(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	cmd := childCommand(t, "journal-ack", "IDEM_JOURNAL="+path)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	created := map[string]string{} // id -> key
	settled := map[string]bool{}
	lines := bufio.NewScanner(stdout)
	for len(created) < 300 && lines.Scan() {
		f := strings.Fields(lines.Text())
		switch {
		case len(f) == 3 && f[0] == "created":
			created[f[2]] = f[1]
		case len(f) == 2 && f[0] == "settled":
			settled[f[1]] = true
		default:
			t.Fatalf("unexpected line %q", lines.Text())
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_, _ = io.Copy(io.Discard, stdout)
	_ = cmd.Wait()
	require.Len(t, created, 300, "the child must have acknowledged 300 creates before it was killed")
	require.Len(t, settled, 298, "every create but the first acknowledges the settlement before it")

	j := openJournal(t, path)
	for id, key := range created {
		rec, err := j.Lookup(context.Background(), "s", id)
		require.NoError(t, err, "acknowledged %s is missing after SIGKILL", id)
		assert.Equal(t, key, rec.Key)
		assert.Equal(t, "body of "+id, string(rec.Body))
		if settled[id] {
			require.Equal(t, idem.StateSucceeded, rec.State, "%s: its settlement was carried by a durable write that returned", id)
			assert.Equal(t, "order for "+id, string(rec.Response.Body))
		} else {
			// The last one: its buffered outcome may or may not have been
			// committed; either way the record is whole.
			assert.Contains(t, []idem.State{idem.StateInFlight, idem.StateSucceeded}, rec.State, id)
		}
	}
}

// A file that carries the journal's mark but no schema version (damaged, or
// crafted) is refused as corrupt, not migrated over its tables.
func TestOpenSQLiteRefusesAMarkedFileWithoutSchemaVersion(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	openJournal(t, path).Close()
	raw, err := sql.Open("sqlite3", path)
	require.NoError(t, err)
	_, err = raw.Exec(`PRAGMA user_version = 0`)
	require.NoError(t, err)
	require.NoError(t, raw.Close())
	before := fileBytes(t, path)

	_, err = idem.OpenSQLite(path)
	require.Error(t, err)
	assert.ErrorIs(t, err, idem.ErrJournalCorrupt)
	var fe *idem.FileError
	assert.ErrorAs(t, err, &fe)
	assert.Contains(t, err.Error(), path)
	assert.Equal(t, before, fileBytes(t, path), "a refused file is left as it was")
}

// An unreadable journal is refused with the path and what to do. Root reads
// any file, so there the test stands a device in for it (not a regular file).
func TestOpenSQLiteRefusesUnreadableFile(t *testing.T) {
	t.Parallel()
	path := "/dev/null"
	says := "not a regular file"
	if os.Geteuid() != 0 {
		path = filepath.Join(t.TempDir(), "ops.db")
		openJournal(t, path).Close()
		require.NoError(t, os.Chmod(path, 0))
		says = "readable and writable"
	}
	_, err := idem.OpenSQLite(path)
	require.Error(t, err)
	assert.ErrorIs(t, err, idem.ErrJournalPath)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), says)
}

func TestSQLiteOnCommitReportsEachCommit(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var commits []idem.CommitInfo
	j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"), idem.SQLiteOnCommit(func(c idem.CommitInfo) {
		mu.Lock()
		defer mu.Unlock()
		commits = append(commits, c)
	}))
	srv, _, _ := countingServer(t)
	c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL})
	const ops = 40
	var wg sync.WaitGroup
	for i := range ops {
		wg.Go(func() {
			_, err := c.Do(t.Context(), idem.Op{ID: fmt.Sprint("op-", i), URL: "/x"})
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	require.NoError(t, j.Sync(t.Context()))
	mu.Lock()
	defer mu.Unlock()
	writes, durable := 0, 0
	for _, cm := range commits {
		assert.Positive(t, cm.Writes, "a commit carries writes")
		assert.Positive(t, cm.Duration)
		writes += cm.Writes
		if cm.Durable {
			durable++
		}
	}
	s := j.Stats()
	assert.EqualValues(t, s.Writes, writes, "every committed write is in one reported commit")
	assert.EqualValues(t, s.DurableCommits, durable, "durable commits as the journal counted them")
	assert.EqualValues(t, s.DurableCommits+s.DeferredCommits, len(commits), "one report per commit")
	assert.GreaterOrEqual(t, writes, 2*ops, "an intent and an outcome per operation")
}

// The journal judges an Update against its own copy of the row it wrote
// last, and writes only if the row still is that copy. Another handle of
// the file (another process) that changed the row, or a renewal that
// extended the lease, must make it read the row instead: the write is then
// judged against what is stored, as if there were no copy.
func TestSQLiteUpdateAfterAnotherHandleChangedTheRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "ops.db")
	a := openJournal(t, path)
	b := openJournal(t, path)

	// Another handle's write: a's copy is stale, and a's write, made from
	// the version a knew, is refused rather than written over b's.
	rec := testRecord("default", "changed-elsewhere", []byte("x"))
	rec.State, rec.Attempts = idem.StateInFlight, 1
	rec.Lease = idem.Lease{Owner: "worker-a", ExpiresAt: time.Now().Add(time.Minute)}
	created, _, err := a.Create(ctx, rec)
	require.NoError(t, err)
	byB := created
	byB.Attempts = 2
	byB.LastError = "written by b"
	_, err = b.Update(ctx, byB, idem.Durable, idem.Event{Kind: idem.EventSend})
	require.NoError(t, err)
	byA := created
	byA.State = idem.StateSucceeded
	byA.Response = &idem.Response{StatusCode: 201}
	_, err = a.Update(ctx, byA, idem.Durable, idem.Event{Kind: idem.EventAnswer})
	require.ErrorIs(t, err, idem.ErrConflict, "a's copy was stale: the write is judged against the stored row")
	stored, err := a.Get(ctx, rec.Key)
	require.NoError(t, err)
	assert.Equal(t, "written by b", stored.LastError)
	assert.Equal(t, idem.StateInFlight, stored.State)
	assert.Nil(t, stored.Response)

	// A renewal extends the lease without a new version: a's next write
	// from the current version goes through, and does not take the
	// renewal back.
	rec2 := testRecord("default", "renewed", []byte("y"))
	rec2.State, rec2.Attempts = idem.StateInFlight, 1
	rec2.Lease = idem.Lease{Owner: "worker-a", ExpiresAt: time.Now().Add(time.Minute)}
	created2, _, err := a.Create(ctx, rec2)
	require.NoError(t, err)
	n, err := b.Renew(ctx, map[string]idem.Lease{rec2.Key: created2.Lease}, time.Hour)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	next := created2
	next.Attempts = 2
	updated, err := a.Update(ctx, next, idem.Durable, idem.Event{Kind: idem.EventSend})
	require.NoError(t, err)
	assert.True(t, updated.Lease.ExpiresAt.After(time.Now().Add(50*time.Minute)), "the renewal's expiry stands: %s", updated.Lease.ExpiresAt)
	stored, err = b.Get(ctx, rec2.Key)
	require.NoError(t, err)
	assert.Equal(t, 2, stored.Attempts)
	assert.Equal(t, updated.Lease.ExpiresAt, stored.Lease.ExpiresAt)

	// And the copy follows a's own writes: two updates in a row from a.
	next = updated
	next.State = idem.StateSucceeded
	next.Response = &idem.Response{StatusCode: 201, Body: []byte("done")}
	done, err := a.Update(ctx, next, idem.Deferred, idem.Event{Kind: idem.EventAnswer})
	require.NoError(t, err)
	stored, err = b.Get(ctx, rec2.Key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, stored.State)
	assert.Equal(t, done.Version, stored.Version)
	require.NotNil(t, stored.Response)
	assert.Equal(t, "done", string(stored.Response.Body))
}
