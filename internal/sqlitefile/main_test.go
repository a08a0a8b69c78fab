package sqlitefile

import (
	"testing"

	"go.uber.org/goleak"
)

// Close must stop the flusher every Open starts.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
