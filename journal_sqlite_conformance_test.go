package idem_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/journaltest"
)

func TestSQLiteJournalConformance(t *testing.T) {
	journaltest.Run(t, func(t *testing.T) idem.Journal {
		j, err := idem.OpenSQLite(filepath.Join(t.TempDir(), "journal.db"))
		require.NoError(t, err)
		return j
	})
}
