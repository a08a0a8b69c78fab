package idem

import "context"

// ImportForBenchmark exposes importRecords to the benchmarks.
func ImportForBenchmark(ctx context.Context, j *SQLiteJournal, n int, gen func(i int) (Record, []Event, error)) error {
	return j.importRecords(ctx, n, gen)
}
