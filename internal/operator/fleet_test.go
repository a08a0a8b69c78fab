package operator

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A worker the alive map names is alive or gone; one it does not name has
// no liveness record (a PostgreSQL journal WithoutLiveness), and its
// status is its leases', as on a journal that cannot tell.
func TestFleetStatus(t *testing.T) {
	ctx := context.Background()
	j := idem.NewMemoryJournal()
	defer j.Close()
	for _, w := range []struct {
		id, owner string
		lease     time.Duration
	}{{"a", "live", time.Hour}, {"b", "dead", time.Hour}, {"c", "unrecorded", time.Hour}, {"d", "unrecorded-lapsed", time.Millisecond}} {
		rec, _, err := j.Create(ctx, idem.Record{Key: "key-" + w.id, Scope: "default", ID: w.id, Method: "POST",
			URL: "https://api.example.com/x", Fingerprint: "f", KeyHeader: "Idempotency-Key", State: idem.StatePending})
		require.NoError(t, err)
		_, err = j.Acquire(ctx, rec.Key, w.owner, w.lease)
		require.NoError(t, err)
	}
	now := time.Now().Add(time.Second) // past the lapsed lease's end
	status := func(alive map[string]bool) map[string]string {
		workers, err := Fleet(ctx, j, alive, now)
		require.NoError(t, err)
		m := map[string]string{}
		for _, w := range workers {
			m[w.Owner] = w.Status
		}
		return m
	}
	assert.Equal(t, map[string]string{"live": "alive", "dead": "gone", "unrecorded": "holding", "unrecorded-lapsed": "lapsed", "idle": "alive"},
		status(map[string]bool{"live": true, "dead": false, "idle": true}))
	assert.Equal(t, map[string]string{"live": "holding", "dead": "holding", "unrecorded": "holding", "unrecorded-lapsed": "lapsed"},
		status(nil))
}
