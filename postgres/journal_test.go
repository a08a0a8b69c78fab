package postgres_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/journaltest"
	"github.com/idemkit/idem/postgres"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// openJournal opens a journal in a schema of its own.
func openJournal(t *testing.T, opts ...postgres.JournalOption) *postgres.Journal {
	t.Helper()
	opts = append([]postgres.JournalOption{postgres.Schema(pgtest.Schema(t))}, opts...)
	j, err := postgres.OpenJournal(context.Background(), pgtest.Pool(t), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	return j
}

func TestJournalConformance(t *testing.T) {
	journaltest.Run(t, func(t *testing.T) idem.Journal { return openJournal(t) })
}

func TestJournalConformanceOneWriteAtATime(t *testing.T) {
	journaltest.Run(t, func(t *testing.T) idem.Journal { return openJournal(t, postgres.MaxBatch(1)) })
}
