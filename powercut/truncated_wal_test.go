package powercut

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The promise: an intent is durable before its request is sent, also when
// the WAL was truncated (wal_checkpoint(TRUNCATE), as SQLiteWALLimit makes
// the committer run) between two durable commits of one process.
func TestReview4PowerCutClientTruncatedWAL(t *testing.T) {
	marks := filepath.Join(t.TempDir(), "shrinks")
	fig := runClientLoop(t, clientLoop{sync: "full", walLimit: 8192, marks: marks})
	t.Log("figures: " + fig.String())
	assertClientLoopKeptItsPromises(t, fig)
	b, _ := os.ReadFile(marks)
	t.Logf("durable commits that found the WAL shorter than the last one did: %d", len(b))
	assert.Positive(t, len(b), "the WAL was truncated between durable commits of one process")
}
