package postgres_test

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"

	"context"
	"github.com/google/uuid"
	"testing"

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
	journaltest.Run(t, func(t *testing.T) idem.Journal { return openJournal(t) })
}

func TestJournalConformanceOneWriteAtATime(t *testing.T) {
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
