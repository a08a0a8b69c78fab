package postgres

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// TestGroupCommitRunsASecondBatchOnlyForManyWaiters: writers that are
// fewer than secondBatch are committed one batch at a time, as before;
// many writers get a second batch beside the first, never a third. Either
// way every write is committed once, and batches still share commits.
func TestGroupCommitRunsASecondBatchOnlyForManyWaiters(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		writers, most int
	}{
		{8, 1},
		{4 * secondBatch, maxRunning},
	} {
		t.Run(fmt.Sprintf("writers=%d", tc.writers), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, schema := pgtest.Pool(t), pgtest.Schema(t)
			j, err := OpenJournal(ctx, pool, Schema(schema))
			require.NoError(t, err)
			defer j.Close()

			var most atomic.Int64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				for {
					select {
					case <-stop:
						return
					default:
					}
					j.mu.Lock()
					n := int64(j.running)
					j.mu.Unlock()
					if n > most.Load() {
						most.Store(n)
					}
					time.Sleep(20 * time.Microsecond)
				}
			}()
			const each = 5
			var wg sync.WaitGroup
			keys := make(chan string, tc.writers*each)
			for w := range tc.writers {
				wg.Go(func() {
					for i := range each {
						rec := idem.Record{Key: fmt.Sprintf("k-%d-%d", w, i), Scope: "s", ID: fmt.Sprintf("op-%d-%d", w, i),
							Method: http.MethodPost, URL: "http://127.0.0.1:9/orders", Body: []byte("{}"), Fingerprint: "fp", KeyHeader: "Idempotency-Key",
							State: idem.StateInFlight, Attempts: 1,
							Lease: idem.Lease{Owner: "w", ExpiresAt: time.Now().Add(time.Minute)}}
						out, created, err := j.Create(ctx, rec)
						if !assert.NoError(t, err) || !assert.True(t, created) {
							return
						}
						out.State = idem.StateSucceeded
						out.Response = &idem.Response{StatusCode: 201}
						if _, err := j.Update(ctx, out, idem.Deferred, idem.Event{Kind: idem.EventAnswer}); !assert.NoError(t, err) {
							return
						}
						keys <- out.Key
					}
				})
			}
			wg.Wait()
			close(stop)
			<-sampled
			close(keys)
			n := 0
			for k := range keys {
				rec, err := j.Get(ctx, k)
				require.NoError(t, err)
				assert.Equal(t, idem.StateSucceeded, rec.State)
				assert.Equal(t, int64(2), rec.Version)
				n++
			}
			require.Equal(t, tc.writers*each, n)
			// Each settle kept the creation event its row held, and holds
			// its own (see journalKind's migrations 7 and 8): no event rows.
			// The rows' xmins are the settles' transactions.
			var events, held, kept, commits int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+j.q.table("events")).Scan(&events))
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE ev_kind IS NOT NULL),
				count(*) FILTER (WHERE cr_kind IS NOT NULL), count(DISTINCT xmin::text) FROM `+j.q.operations).Scan(&held, &kept, &commits))
			assert.Equal(t, 2*n, events+held+kept, "every write once")
			assert.Equal(t, n, held, "the settles' events in their rows")
			assert.Equal(t, n, kept, "the creation events kept in their rows")
			assert.Less(t, commits, n, "writes share commits")
			assert.Equal(t, int64(tc.most), most.Load(), "batches at once")
		})
	}
}
