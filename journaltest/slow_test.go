package journaltest

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// slowJournal is a correct journal on a slow machine: each Update takes
// 20 ms.
type slowJournal struct{ idem.Journal }

func (j slowJournal) Update(ctx context.Context, rec idem.Record, d idem.Durability, why idem.Event) (idem.Record, error) {
	time.Sleep(20 * time.Millisecond)
	return j.Journal.Update(ctx, rec, d, why)
}

// A journal that is merely slow (a loaded machine: the 300 updates here
// take over 6 s) passes the List tests: they fail a journal that hangs, not
// one that takes its time.
func TestASlowJournalIsNotTakenForAHungOne(t *testing.T) {
	t.Parallel()
	j := openJournal(t, func(*testing.T) idem.Journal { return slowJournal{idem.NewMemoryJournal()} })
	testListWrites(t, j)
}
