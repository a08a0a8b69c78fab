package postgres_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/journaltest"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgschema"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// openJournal opens a journal in a schema of its own.
func openJournal(t *testing.T, opts ...postgres.Option) *postgres.Journal {
	t.Helper()
	opts = append([]postgres.Option{postgres.Schema(pgtest.Schema(t))}, opts...)
	j, err := postgres.OpenJournal(context.Background(), pgtest.Pool(t), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	return j
}

func TestJournalConformance(t *testing.T) {
	// Each test has a schema of its own and mostly waits on the server's
	// commits: the suites run beside each other and the parallel tests.
	t.Parallel()
	journaltest.Run(t, func(t *testing.T) idem.Journal { return openJournal(t) })
}

func TestJournalConformanceOneWriteAtATime(t *testing.T) {
	t.Parallel()
	journaltest.Run(t, func(t *testing.T) idem.Journal { return openJournal(t, postgres.MaxBatch(1)) })
}

// newRecord returns a new pending operation of scope, due now.
func newRecord(scope string) idem.Record {
	body := []byte(`{"item":"book","quantity":1}`)
	sum := sha256.Sum256(body)
	return idem.Record{
		Key:         uuid.NewString(),
		Scope:       scope,
		ID:          "op-" + uuid.NewString(),
		Method:      http.MethodPost,
		URL:         "http://127.0.0.1:9/orders",
		Header:      http.Header{"Content-Type": {"application/json"}},
		Body:        body,
		Fingerprint: hex.EncodeToString(sum[:]),
		KeyHeader:   "Idempotency-Key",
		State:       idem.StatePending,
	}
}

// OnCommit reports each transaction of writes: together they carry every
// write, intents (synchronous_commit on) as durable commits; many writers
// share commits.
func TestOnCommitReportsEachCommit(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var commits []idem.CommitInfo
	j := openJournal(t, postgres.OnCommit(func(c idem.CommitInfo) {
		mu.Lock()
		defer mu.Unlock()
		commits = append(commits, c)
	}))
	const ops = 40
	var wg sync.WaitGroup
	for range ops {
		wg.Go(func() {
			rec := newRecord("shop")
			rec.State, rec.Attempts = idem.StateInFlight, 1
			rec.Lease = idem.Lease{Owner: "worker-1", ExpiresAt: time.Now().Add(time.Minute)}
			created, _, err := j.Create(ctx, rec)
			if !assert.NoError(t, err) {
				return
			}
			next := created
			next.State = idem.StateSucceeded
			next.Response = &idem.Response{StatusCode: 201}
			_, err = j.Update(ctx, next, idem.Deferred, idem.Event{Kind: idem.EventAnswer})
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	writes, durable := 0, 0
	for _, c := range commits {
		assert.Positive(t, c.Writes)
		assert.Positive(t, c.Duration)
		writes += c.Writes
		if c.Durable {
			durable++
		}
	}
	assert.Equal(t, 2*ops, writes, "every write in one reported commit")
	assert.Positive(t, durable, "the intents' commits waited for the flush")
	assert.Less(t, len(commits), 2*ops, "writers shared commits")
}

// A Do that goes right writes no row of events: the event of the row's
// current version is kept in the row, and written into events by the
// write that moves the row past it, but for the creation event, which that
// write keeps in the row (schema 8). History, a reader of the row and of
// events, is the same whichever holds each event; an update after a read
// (Acquire) writes both its own event and the one the row held.
func TestTheRowKeepsItsLastEvent(t *testing.T) {
	t.Parallel()
	j := openJournal(t)
	rec := newRecord("shop")
	rec.State, rec.Attempts = idem.StateInFlight, 1
	rec.Lease = idem.Lease{Owner: "worker-1", ExpiresAt: time.Now().Add(time.Minute)}
	created, _, err := j.Create(ctx, rec)
	require.NoError(t, err)
	s := pgschema.Ident(j.Schema())
	written := func() int {
		var n int
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+s+`.events e
			JOIN `+s+`.operations o ON o.id = e.op WHERE o.key = $1`, rec.Key).Scan(&n))
		return n
	}
	history := func(n int) []idem.Event {
		h, err := j.History(ctx, rec.Key)
		require.NoError(t, err)
		require.Len(t, h, n)
		for i, ev := range h {
			assert.Equal(t, int64(i+1), ev.Version, "the history in version order")
		}
		return h
	}
	assert.Zero(t, written(), "the creation event is in the row")
	h := history(1)
	assert.Equal(t, idem.EventCreate, h[0].Kind)
	assert.Equal(t, idem.StateInFlight, h[0].To)
	assert.Equal(t, "worker-1", h[0].Owner)

	retry := created
	retry.State, retry.NextAttemptAt = idem.StatePending, time.Now().Add(-time.Second)
	retried, err := j.Update(ctx, retry, idem.Durable, idem.Event{Kind: idem.EventAnswer, Detail: "503"})
	require.NoError(t, err)
	assert.Zero(t, written(), "the update kept the creation event in the row, and its own")
	h = history(2)
	assert.Equal(t, idem.EventAnswer, h[1].Kind)
	assert.Equal(t, "503", h[1].Detail)
	assert.Equal(t, idem.StateInFlight, h[1].From)
	assert.Equal(t, idem.StatePending, h[1].To)
	assert.Equal(t, "worker-1", h[1].Owner, "the writer's lease, which the row no longer carries")

	require.NoError(t, j.Release(ctx, rec.Key, retried.Lease))
	h2, err := j.History(ctx, rec.Key)
	require.NoError(t, err)
	assert.Equal(t, h, h2, "a release, which changes the row's owner and time, changes no event")

	acquired, err := j.Acquire(ctx, rec.Key, "worker-2", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, 2, written(), "an update after a read writes the event the row held and its own")
	h3 := history(3)
	assert.Equal(t, h, h3[:2], "the events written out are those the row held")
	assert.Equal(t, "worker-2", h3[2].Owner)

	done := acquired
	done.State, done.Response = idem.StateSucceeded, &idem.Response{StatusCode: 201}
	_, err = j.Update(ctx, done, idem.Durable, idem.Event{Kind: idem.EventAnswer})
	require.NoError(t, err)
	h4 := history(4)
	assert.Equal(t, 201, h4[3].StatusCode)
	assert.Equal(t, idem.StateSucceeded, h4[3].To)
}
