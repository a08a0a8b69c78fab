package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
)

// TestWritesWithoutAReadCommitAtTheirOwnLevelOnOneSession: the writes made
// without a read (one statement each, in the implicit transaction their
// Sync ends, which sets synchronous_commit for that transaction alone) run
// one after another on the one session of the pool, whose role starts it
// with synchronous_commit off, local or remote_write. Each durable write
// (a create, an intent; a durable update) must commit at a level that
// waits for the local flush, whatever the deferred write before it on the
// same session set: a level that outlived its transaction would leave the
// next intent on a session at off. A deferred write commits at off.
// Creates made at once, which the journal may write as one batch (one
// insert, the level set by the batch's last statement), commit at the
// durable level too.
func TestWritesWithoutAReadCommitAtTheirOwnLevelOnOneSession(t *testing.T) {
	t.Parallel()
	for _, def := range []string{"off", "local", "remote_write"} {
		t.Run(def, func(t *testing.T) {
			t.Parallel()
			durable := def
			if def == "off" {
				durable = "on"
			}
			pool := poolWithDefaults(t, "role", 1, map[string]string{"synchronous_commit": def}).pool
			ctx := context.Background()
			schema := "idem"
			j, err := postgres.OpenJournal(ctx, pool, postgres.Schema(schema))
			require.NoError(t, err)
			defer j.Close()
			levels := recordCommitLevels(t, pool, schema, "operations")

			rec := newRecord("shop")
			rec.State, rec.Attempts = idem.StateInFlight, 1
			rec.Lease = idem.Lease{Owner: "w1", ExpiresAt: time.Now().Add(time.Minute)}
			cur, _, err := j.Create(ctx, rec)
			require.NoError(t, err)
			levels.expect(t, "the intent", durable)

			for i, d := range []idem.Durability{idem.Buffered, idem.Durable, idem.Buffered, idem.Durable} {
				next := cur
				next.Attempts = cur.Attempts + 1
				cur, err = j.Update(ctx, next, d, idem.Event{Kind: idem.EventSend})
				require.NoError(t, err)
				want := "off"
				if d == idem.Durable {
					want = durable
				}
				levels.expect(t, "update "+d.String()+" #"+string(rune('1'+i)), want)

				after := newRecord("shop")
				_, _, err = j.Create(ctx, after)
				require.NoError(t, err)
				levels.expect(t, "the intent after update "+d.String()+" #"+string(rune('1'+i)), durable)
			}

			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _, err := j.Create(ctx, newRecord("shop"))
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			levels.expect(t, "creates written together", durable)
		})
	}
}
