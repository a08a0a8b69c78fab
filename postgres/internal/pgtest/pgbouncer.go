package pgtest

import (
	"testing"

	"github.com/idemkit/idem/internal/pgbouncer"
)

// Bouncer is a PgBouncer of a test's own in front of the tests' server, in
// transaction pooling mode (see the pgbouncer package, which the idem
// command's tests share).
type Bouncer = pgbouncer.Bouncer

// StartBouncer starts a PgBouncer in front of the tests' server (DSN) and
// waits until it accepts connections. A test is skipped, saying what to
// install, only where the pgbouncer program is absent (.ci/run installs
// it).
func StartBouncer(t testing.TB) *Bouncer {
	t.Helper()
	return pgbouncer.Start(t, DSN())
}

// StartBouncerWith is StartBouncer with settings of the [pgbouncer]
// section ("pool_mode = statement", say) that replace the defaults.
func StartBouncerWith(t testing.TB, settings ...string) *Bouncer {
	t.Helper()
	return pgbouncer.Start(t, DSN(), settings...)
}
