package idem_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func init() { children["create-only"] = childCreateOnly }

// childCreateOnly creates the journal at IDEM_TEST_JOURNAL and closes it.
func childCreateOnly() error {
	j, err := idem.OpenSQLite(os.Getenv("IDEM_TEST_JOURNAL"))
	if err != nil {
		return err
	}
	return j.Close()
}

// notJournalWhileCreated opens the journal at a new path with opts, over
// and over, while a child process creates it, until an open succeeds;
// it does so for rounds new journals, and returns, for each round in
// which an open said the file is not a journal, the first such error.
func notJournalWhileCreated(t *testing.T, rounds int, opts ...idem.SQLiteOption) []error {
	t.Helper()
	var wrong []error
	for range rounds {
		var first error
		path := filepath.Join(t.TempDir(), "ops.db")
		child := childCommand(t, "create-only", "IDEM_TEST_JOURNAL="+path)
		require.NoError(t, child.Start())
		done := make(chan error, 1)
		go func() { done <- child.Wait() }()
		exited := false
		for {
			j, err := idem.OpenSQLite(path, opts...)
			if err == nil {
				require.NoError(t, j.Close())
				break
			}
			if errors.Is(err, idem.ErrNotJournal) && first == nil {
				first = err
			}
			if exited {
				t.Fatalf("the journal the child created does not open: %v", err)
			}
			select {
			case err := <-done:
				require.NoError(t, err, "the child created the journal")
				exited = true
			default:
			}
		}
		if !exited {
			require.NoError(t, <-done, "the child created the journal")
		}
		if first != nil {
			wrong = append(wrong, first)
		}
	}
	return wrong
}

// An operator's command (idem ls: SQLiteReadOnly; idem resume, reconcile,
// migrate: SQLiteMustExist) run while the application is creating its
// journal finds the file there, but empty until the creator's first
// transaction commits. That is a journal being created, not "not an idem
// journal": the open must wait for the creator (it holds the file's lock)
// or say that it is being created, as an open that creates the journal
// waits for another creator. Each open below runs while a child process
// creates the journal, until one succeeds, over 5 new journals.
func TestSQLiteOpenedByAnOperatorWhileAnotherProcessCreatesIt(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		opts []idem.SQLiteOption
	}{
		{"read-only", []idem.SQLiteOption{idem.SQLiteReadOnly()}},
		{"must exist", []idem.SQLiteOption{idem.SQLiteMustExist()}},
	} {
		t.Run(c.name, func(t *testing.T) {
			const rounds = 5
			wrong := notJournalWhileCreated(t, rounds, c.opts...)
			if len(wrong) > 0 {
				assert.Fail(t, "an open called the journal another process was creating not a journal",
					"in %d of %d rounds; the first: %v", len(wrong), rounds, wrong[0])
			}
		})
	}
}
