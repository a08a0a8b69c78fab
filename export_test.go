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

// SQLiteOnBuilt calls f when a new journal file has been built under its
// temporary name tmp, before it is put at its path, so that a test can
// stop (and kill) its creator there.
func SQLiteOnBuilt(f func(tmp string)) SQLiteOption {
	return func(c *sqliteConfig) { c.file.OnBuilt = f }
}
