package otel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem"
)

const (
	metricCommitDuration = "idem.client.journal.commit.duration"
	metricCommitWrites   = "idem.client.journal.commit.writes"
)

var (
	commitBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}
	writeBuckets  = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256}
)

// JournalCommitHook returns a function that records each commit of the
// client's journal, for idem.SQLiteOnCommit or the PostgreSQL journal's
// postgres.OnCommit:
//
//	j, err := idem.OpenSQLite("ops.db", idem.SQLiteOnCommit(otel.JournalCommitHook()))
//	j, err := postgres.OpenJournal(ctx, pool, postgres.OnCommit(otel.JournalCommitHook()))
//
// It records idem.client.journal.commit.duration (s: how long the commit's
// writers waited at most) and idem.client.journal.commit.writes ({write}:
// the journal writes one transaction carried, which group commit shares
// among operations), each with idem.journal.durable (the commit waited for
// fsync). Only WithMeterProvider applies.
func JournalCommitHook(opts ...Option) func(idem.CommitInfo) {
	cfg := newConfig(opts)
	m := cfg.meterProvider.Meter(instrumentationName)
	duration, err := m.Float64Histogram(metricCommitDuration, metric.WithUnit("s"),
		metric.WithDescription("Time from the start of a journal commit's batch to the end of the commit: the longest any of its writers waited."),
		metric.WithExplicitBucketBoundaries(commitBuckets...))
	handle(err)
	writes, err := m.Int64Histogram(metricCommitWrites, metric.WithUnit("{write}"),
		metric.WithDescription("Journal writes one commit carried (group commit shares a transaction among operations)."),
		metric.WithExplicitBucketBoundaries(writeBuckets...))
	handle(err)
	// Two attribute sets, made once: a commit records without allocating.
	durable := metric.WithAttributeSet(attribute.NewSet(keyDurable.Bool(true)))
	deferred := metric.WithAttributeSet(attribute.NewSet(keyDurable.Bool(false)))
	return func(ci idem.CommitInfo) {
		set := deferred
		if ci.Durable {
			set = durable
		}
		ctx := context.Background()
		duration.Record(ctx, ci.Duration.Seconds(), set)
		writes.Record(ctx, int64(ci.Writes), set)
	}
}
