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
