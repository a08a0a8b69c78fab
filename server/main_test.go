package server_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test must leave no goroutine behind: Close stops what New started,
// stores close their connections, and test servers and their clients are
// closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
