package postgres

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// clockRefresh is how long a measured offset to the database server's
// clock is used before it is measured again: a clock that is stepped (by
// NTP, by hand) is followed within it.
const clockRefresh = 30 * time.Second

// dbClock is the database server's clock as this process reads it: its
// own clock (local) plus the offset between the two, measured against
// clock_timestamp(). Every time the journal and the store write or judge
// (a lease's end, a lock's staleness, a key's retention) is the server's,
// so that workers and replicas whose clocks disagree, by any amount,
// agree on them; a caller's own times (the middleware's Now, a record's
// ExpiresAt) are moved onto the server's clock on the way in and back on
// the way out.
//
// An offset is known to within half the round trip of the statement that
// measured it (its error). An offset within its error (and a millisecond)
// of zero is zero: the clocks agree as far as can be told, as they do on
// one machine, and times pass through unchanged. A new measurement
// replaces the offset when it is much more precise, or when the two
// disagree by more than both errors together: the clock was stepped.
// Otherwise the offset stays as it was, so that a time given and read
// back comes back exactly as given.
type dbClock struct {
	local func() time.Time // this process's clock; tests skew it

	mu       sync.Mutex
	offset   time.Duration // server minus local
	err      time.Duration // half the round trip of the measurement
	measured time.Time     // local, when it was taken; zero: never
}

func newDBClock() *dbClock { return &dbClock{local: time.Now} }

// now is the server's time.
func (c *dbClock) now() time.Time { return c.local().Add(c.off()) }

// off is the offset to add to a local time to make it the server's.
func (c *dbClock) off() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.offset
}

// refresh measures the offset if it was never measured, or not for
// clockRefresh: one statement, once in that time.
func (c *dbClock) refresh(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) error {
	c.mu.Lock()
	due := c.measured.IsZero() || time.Since(c.measured) >= clockRefresh
	c.mu.Unlock()
	if !due {
		return nil
	}
	before := c.local()
	// As a number: a timestamp read as text (pgx's exec and simple
	// protocol modes, as behind an older PgBouncer) is in the session's
	// DateStyle, which a role or a database may set to one pgx cannot
	// parse.
	var micros int64
	if err := q.QueryRow(ctx, `SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint`).Scan(&micros); err != nil {
		return err
	}
	server := time.UnixMicro(micros)
	c.observe(before, c.local(), server)
	return nil
}

// observe takes a reading of the server's clock made between before and
// after, on the local clock.
func (c *dbClock) observe(before, after, server time.Time) {
	rtt := after.Sub(before)
	off, err := server.Sub(before.Add(rtt/2)), rtt/2
	if off.Abs() <= err+time.Millisecond {
		off = 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.measured.IsZero() || 4*err < c.err || (off-c.offset).Abs() > err+c.err {
		c.offset, c.err = off, err
	}
	c.measured = time.Now()
}
