package idem_test

import (
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/journaltest"
)

func TestMemoryJournalConformance(t *testing.T) {
	journaltest.Run(t, func(t *testing.T) idem.Journal {
		return idem.NewMemoryJournal()
	})
}
