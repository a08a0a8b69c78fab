package idem

import (
	"context"
	"time"
)

// ImportForBenchmark exposes importRecords to the benchmarks.
func ImportForBenchmark(ctx context.Context, j *SQLiteJournal, n int, gen func(i int) (Record, []Event, error)) error {
	return j.importRecords(ctx, n, gen)
}

// SQLiteLingerDelay sets how long buffered writes wait for another write to
// commit them, so that tests can watch them before they are committed.
func SQLiteLingerDelay(d time.Duration) SQLiteOption {
	return func(c *sqliteConfig) { c.file.LingerDelay = d }
}
