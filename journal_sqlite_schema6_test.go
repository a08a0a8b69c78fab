package idem_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func init() { children["open-journal"] = childOpenJournal }

// childOpenJournal opens the journal at IDEM_TEST_JOURNAL (migrating it),
// prints how many records it lists, and closes it.
func childOpenJournal() error {
	j, err := idem.OpenSQLite(os.Getenv("IDEM_TEST_JOURNAL"), idem.SQLiteMustExist())
	if err != nil {
		return err
	}
	n := 0
	for _, err := range j.List(context.Background(), idem.Filter{}) {
		if err != nil {
			j.Close()
			return err
		}
		n++
	}
	fmt.Println("listed", n)
	return j.Close()
}

// downgradeToSchema5 makes the journal at path what the code of schema 5
// (3f24f53) wrote: schema 6 changed nothing but the due index's order.
func downgradeToSchema5(t *testing.T, path string) {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path)
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`DROP INDEX operations_due;
		CREATE INDEX operations_due ON operations (state, next_attempt_at);
		PRAGMA user_version=5`)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	require.Equal(t, 5, userVersion(t, path))
}

// copyJournal copies the journal at from (its WAL too) to to.
func copyJournal(t *testing.T, from, to string) {
	t.Helper()
	for _, suffix := range []string{"", "-wal"} {
		b, err := os.ReadFile(from + suffix)
		if os.IsNotExist(err) && suffix != "" {
			continue
		}
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(to+suffix, b, 0o600))
	}
}

// everyStateJournal writes a schema-6 journal at path with operations in
// every state, some due long ago, some in a century, some leased.
func everyStateJournal(t *testing.T, path string) {
	t.Helper()
	ctx := context.Background()
	j, err := idem.OpenSQLite(path)
	require.NoError(t, err)
	past, future := time.Now().Add(-24*time.Hour), time.Now().Add(100*365*24*time.Hour)
	n := 0
	for _, state := range idem.States() {
		for _, due := range []time.Time{past, future} {
			for _, leased := range []bool{false, true} {
				n++
				rec := testRecord("every", "op-"+strconv.Itoa(n), []byte("body "+strconv.Itoa(n)))
				if state == idem.StatePending {
					rec.NextAttemptAt = due
					if leased {
						rec.Lease = idem.Lease{Owner: "other", ExpiresAt: time.Now().Add(time.Hour)}
					}
					_, _, err := j.Create(ctx, rec)
					require.NoError(t, err)
					continue
				}
				if state != idem.StateCanceled { // canceled comes from pending only
					rec.State, rec.Attempts = idem.StateInFlight, 1
				}
				rec.Lease = idem.Lease{Owner: "writer", ExpiresAt: time.Now().Add(time.Hour)}
				created, _, err := j.Create(ctx, rec)
				require.NoError(t, err)
				next := created
				next.State, next.NextAttemptAt = state, due
				switch state {
				case idem.StateSucceeded, idem.StateRejected:
					next.Response = &idem.Response{StatusCode: map[idem.State]int{idem.StateSucceeded: 201, idem.StateRejected: 409}[state]}
				}
				updated, err := j.Update(ctx, next, idem.Durable, idem.Event{Detail: "every state"})
				require.NoError(t, err, "to %s", state)
				if !leased && updated.Lease.Owner != "" {
					require.NoError(t, j.Release(ctx, updated.Key, updated.Lease))
				}
			}
		}
	}
	require.NoError(t, j.Close())
}

// journalAnswers is what a journal answers about every operation it holds.
type journalAnswers struct {
	Records []idem.Record
	Counts  []idem.Count
	History map[string][]idem.Event
}

func answers(t *testing.T, j *idem.SQLiteJournal) journalAnswers {
	t.Helper()
	ctx := context.Background()
	a := journalAnswers{History: map[string][]idem.Event{}}
	for rec, err := range j.List(ctx, idem.Filter{}) {
		require.NoError(t, err)
		a.Records = append(a.Records, rec)
		evs, err := j.History(ctx, rec.Key)
		require.NoError(t, err)
		a.History[rec.Key] = evs
	}
	var err error
	a.Counts, err = j.Count(ctx)
	require.NoError(t, err)
	return a
}

// Schema 6 only rebuilt the due index in descending state order: a journal
// of schema 5 with operations in every state (due or not, leased or not)
// must answer List, Get, Count and History exactly as the same journal
// written at schema 6 does, and Claim must claim the same operations in
// the same order.
func TestSQLiteSchema5MigrationKeepsEveryStatesAnswers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	v6, v5 := filepath.Join(dir, "v6.db"), filepath.Join(dir, "v5.db")
	everyStateJournal(t, v6)
	copyJournal(t, v6, v5)
	downgradeToSchema5(t, v5)

	j6, j5 := openJournal(t, v6), openJournal(t, v5)
	require.Equal(t, 6, userVersion(t, v5), "opening it migrated it")
	want, got := answers(t, j6), answers(t, j5)
	require.Len(t, want.Records, 2*2*len(idem.States()))
	assert.Equal(t, want, got)

	ctx := context.Background()
	for _, j := range []*idem.SQLiteJournal{j6, j5} {
		for _, rec := range want.Records {
			g, err := j.Get(ctx, rec.Key)
			require.NoError(t, err)
			assert.Equal(t, rec, g)
		}
	}
	claim := func(j *idem.SQLiteJournal) []string {
		recs, err := j.Claim(ctx, idem.ClaimRequest{Owner: "worker", Limit: 100, Lease: time.Minute})
		require.NoError(t, err)
		var keys []string
		for _, r := range recs {
			keys = append(keys, r.ID+"/"+r.State.String())
		}
		return keys
	}
	wantClaim := claim(j6)
	assert.NotEmpty(t, wantClaim, "the journal has due, unleased operations")
	assert.Equal(t, wantClaim, claim(j5))
}

// bigSchema5Journal writes a schema-5 journal at path holding n operations
// spread over every state and due time, copied in SQL from one written
// through the journal.
func bigSchema5Journal(t *testing.T, path string, n int) {
	t.Helper()
	j, err := idem.OpenSQLite(path)
	require.NoError(t, err)
	_, _, err = j.Create(context.Background(), testRecord("big", "op-0", []byte("body")))
	require.NoError(t, err)
	require.NoError(t, j.Close())
	db, err := sql.Open("sqlite3", "file:"+path)
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
		INSERT INTO operations (key, scope, op_id, method, url, header, body, fingerprint, state, attempts,
			next_attempt_at, lease_owner, lease_epoch, lease_expires_at, last_error, note, created_at,
			updated_at, expires_at, version, form)
		SELECT randomblob(16), o.scope, 'op-' || n.i, o.method, o.url, o.header, o.body, o.fingerprint,
			1 + n.i % 7, o.attempts, CASE WHEN n.i % 7 IN (0, 1, 2) THEN o.next_attempt_at + n.i * 1000 ELSE 0 END,
			NULL, o.lease_epoch, NULL, NULL, NULL, o.created_at, o.updated_at, o.expires_at, o.version, o.form
		FROM n, operations o WHERE o.op_id = 'op-0'`, n-1)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	downgradeToSchema5(t, path)
}

// planOf returns the lines of EXPLAIN QUERY PLAN for q.
func planOf(t *testing.T, db *sql.DB, q string, args ...any) string {
	t.Helper()
	rows, err := db.Query("EXPLAIN QUERY PLAN "+q, args...)
	require.NoError(t, err)
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		require.NoError(t, rows.Scan(&id, &parent, &notused, &detail))
		lines = append(lines, detail)
	}
	require.NoError(t, rows.Err())
	return strings.Join(lines, "\n")
}

// The due index of schema 6 must serve Claim's queries as schema 5's did:
// on a 50,000-operation journal migrated from schema 5, each per-state
// query of claimable (journal_sqlite.go) and goneOwners' query search the
// due index, with no scan of the table and no sort the schema-5 plan did
// not have.
func TestSQLiteSchema6DueIndexServesClaimOnAMigratedJournal(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	bigSchema5Journal(t, path, 50_000)
	queries := []string{
		`SELECT DISTINCT o.lease_owner, d.value FROM operations o JOIN dict d ON d.id = o.lease_owner
		WHERE o.state IN (1, 2, 3) AND o.next_attempt_at <= ?1 AND o.lease_expires_at > ?2`,
	}
	for _, state := range []idem.State{idem.StatePending, idem.StateInFlight, idem.StateUnknown} {
		queries = append(queries, fmt.Sprintf(`SELECT o.id FROM operations o WHERE o.state = %d
			AND o.next_attempt_at <= ?1 AND (o.lease_owner IS NULL OR o.lease_expires_at <= ?2)
			ORDER BY o.next_attempt_at, o.id LIMIT ?3`, state))
	}
	plans := func() []string {
		db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
		require.NoError(t, err)
		defer db.Close()
		var out []string
		for _, q := range queries {
			now := time.Now().UnixMilli()
			args := []any{now, now, 10}
			if !strings.Contains(q, "?3") {
				args = args[:2]
			}
			out = append(out, planOf(t, db, q, args...))
		}
		return out
	}
	before := plans()
	openJournal(t, path).Close()
	require.Equal(t, 6, userVersion(t, path))
	after := plans()
	for i, p := range after {
		t.Logf("query %d at schema 6:\n%s", i, p)
		assert.Contains(t, p, "operations_due", "query %d searches the due index:\n%s", i, p)
		assert.NotRegexp(t, `(?m)^SCAN o$`, p, "query %d scans no table", i)
		assert.Equal(t, strings.Count(before[i], "TEMP B-TREE"), strings.Count(p, "TEMP B-TREE"),
			"query %d sorts no more than at schema 5:\nbefore:\n%s\nafter:\n%s", i, before[i], p)
	}
}

// Two processes (here four) opening the same schema-5 journal at once:
// one migrates it, in one transaction, and every one opens it and lists
// every operation.
func TestSQLiteSchema5OpenedByFourProcessesAtOnce(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	const n = 20_000
	bigSchema5Journal(t, path, n)
	var wg sync.WaitGroup
	outs := make([]string, 4)
	errs := make([]error, 4)
	for i := range outs {
		wg.Go(func() {
			cmd := childCommand(t, "open-journal", "IDEM_TEST_JOURNAL="+path)
			b, err := cmd.Output()
			outs[i], errs[i] = strings.TrimSpace(string(b)), err
		})
	}
	wg.Wait()
	for i := range outs {
		assert.NoError(t, errs[i], "process %d opened the journal", i)
		assert.Equal(t, "listed "+strconv.Itoa(n), outs[i], "process %d", i)
	}
	assert.Equal(t, 6, userVersion(t, path))
}

// A process killed (SIGKILL) at any point of a schema-5 journal's
// migration leaves a journal that opens afterwards, at schema 5 or 6, and
// then at 6, with every operation.
func TestSQLiteSchema5MigrationKilledAnywhereLosesNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	orig := filepath.Join(dir, "v5.db")
	const n = 20_000
	bigSchema5Journal(t, orig, n)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, seed))
	for i := range 8 {
		path := filepath.Join(dir, fmt.Sprintf("try%d.db", i))
		copyJournal(t, orig, path)
		cmd := childCommand(t, "open-journal", "IDEM_TEST_JOURNAL="+path)
		cmd.Stdout = io.Discard
		require.NoError(t, cmd.Start())
		time.Sleep(time.Duration(rnd.Int64N(int64(300 * time.Millisecond))))
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		v := userVersion(t, path)
		assert.Contains(t, []int{5, 6}, v, "try %d: the killed migration left schema 5 or 6", i)
		j, err := idem.OpenSQLite(path, idem.SQLiteMustExist())
		require.NoError(t, err, "try %d: the journal opens after the kill", i)
		counts, err := j.Count(context.Background())
		require.NoError(t, err)
		total := 0
		for _, c := range counts {
			total += c.N
		}
		assert.Equal(t, n, total, "try %d: every operation is still there", i)
		require.NoError(t, j.Close())
		assert.Equal(t, 6, userVersion(t, path), "try %d", i)
	}
}

// A schema-5 journal that was put in rollback-journal mode (an operator's
// sqlite3 shell, a backup tool) is migrated before it is switched back to
// WAL: the open succeeds, and the file ends at schema 6, in WAL mode, with
// every operation.
func TestSQLiteSchema5InRollbackJournalModeMigrates(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ops.db")
	const n = 1000
	bigSchema5Journal(t, path, n)
	db, err := sql.Open("sqlite3", "file:"+path)
	require.NoError(t, err)
	var mode string
	require.NoError(t, db.QueryRow("PRAGMA journal_mode=DELETE").Scan(&mode))
	require.Equal(t, "delete", mode)
	require.NoError(t, db.Close())

	j := openJournal(t, path)
	counts, err := j.Count(context.Background())
	require.NoError(t, err)
	total := 0
	for _, c := range counts {
		total += c.N
	}
	assert.Equal(t, n, total)
	require.NoError(t, j.Close())
	assert.Equal(t, 6, userVersion(t, path))
	db, err = sql.Open("sqlite3", "file:"+path)
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.QueryRow("PRAGMA journal_mode").Scan(&mode))
	assert.Equal(t, "wal", mode)
}
