package otel_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/idemkit/idem"
	idemotel "github.com/idemkit/idem/otel"
)

func TestJournalCommitHook(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	srv := tel.startServer(t)
	j, err := idem.OpenSQLite(filepath.Join(t.TempDir(), "ops.db"),
		idem.SQLiteOnCommit(idemotel.JournalCommitHook(idemotel.WithMeterProvider(tel.mp))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry()})
	require.NoError(t, err)
	for i := range 3 {
		_, err := c.Do(t.Context(), orderOp("checkout/commit-"+string(rune('a'+i)), 1))
		require.NoError(t, err)
	}
	require.NoError(t, c.Close()) // commits and fsyncs the last outcome

	durable := attribute.Bool("idem.journal.durable", true)
	n, writes := tel.histogram(t, "idem.client.journal.commit.writes", durable)
	t.Logf("durable commits %d, writes %v", n, writes)
	assert.GreaterOrEqual(t, n, uint64(3), "each intent is committed durably before it is sent")
	dn, seconds := tel.histogram(t, "idem.client.journal.commit.duration", durable)
	assert.Equal(t, n, dn, "one duration per commit")
	assert.Positive(t, seconds)
	_, all := tel.histogram(t, "idem.client.journal.commit.writes")
	assert.GreaterOrEqual(t, all, 6.0, "three intents and three outcomes, at least")
}
