package postgres_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres"
)

// TestNoReadFailsOnASessionEndedForIdling: each of the journal's reads,
// its first statement on a pooled session that the server ended for
// idling past idle_session_timeout (57P05, see
// TestNoCallFailsOnASessionEndedForIdling), reads on another session
// instead of failing its caller; on a ReadOnly journal too, whose reads
// begin a transaction.
func TestNoReadFailsOnASessionEndedForIdling(t *testing.T) {
	t.Parallel()
	// Idle past the timeout, within pgxpool's second.
	const idle = 600 * time.Millisecond
	db := poolWithDefaults(t, "role", 3, map[string]string{"idle_session_timeout": "200ms"})
	w := openOn(t, db.pool, "idem")
	keys := createRecords(t, w, 2)
	unregister, err := w.Register(ctx, "worker")
	require.NoError(t, err)
	t.Cleanup(func() { _ = unregister() })
	for name, j := range map[string]*postgres.Journal{"read-write": w, "read-only": openOn(t, db.pool, "idem", postgres.ReadOnly())} {
		reads := map[string]func() error{
			"Get": func() error { _, err := j.Get(ctx, keys[0]); return err },
			"Count": func() error {
				c, err := j.Count(ctx)
				if err == nil {
					assert.Len(t, c, 1)
				}
				return err
			},
			"History": func() error { _, err := j.History(ctx, keys[0]); return err },
			"Owners": func() error {
				o, err := j.Owners(ctx)
				if err == nil {
					assert.Len(t, o, 1)
				}
				return err
			},
			"List": func() error {
				n := 0
				for _, err := range j.List(ctx, idem.Filter{}) {
					if err != nil {
						return err
					}
					n++
				}
				assert.Equal(t, 2, n)
				return nil
			},
			"List after a key": func() error {
				for _, err := range j.List(ctx, idem.Filter{After: keys[0]}) {
					if err != nil {
						return err
					}
				}
				return nil
			},
		}
		for what, read := range reads {
			time.Sleep(idle)
			assert.NoError(t, read(), "%s journal: %s after idling", name, what)
		}
	}
}
