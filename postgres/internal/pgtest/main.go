package pgtest

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Main runs a package's tests, then closes the shared pool and fails the
// run if any goroutine is left behind. Call it from TestMain: the pool's
// own goroutines end with it, so whatever goleak still finds was started
// by the code under test and never stopped.
func Main(m *testing.M) {
	code := m.Run()
	if pool != nil {
		pool.Close()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines left behind after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
