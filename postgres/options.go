package postgres

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/postgres/internal/pgschema"
)

// ErrNotMigrated reports tables that are missing or older than this build,
// found by OpenJournal or OpenStore told not to migrate them
// (WithoutMigration). Run MigrateJournal or MigrateStore, or open without
// WithoutMigration.
var ErrNotMigrated = errors.New("idem tables are not migrated")

// ErrReadOnly reports a database whose sessions refuse writes: a hot
// standby, or a role or database with default_transaction_read_only on.
// OpenJournal and OpenStore refuse such a pool when they would migrate,
// and OpenStore always (every claim writes); a journal may be opened
// WithoutMigration on it to be read (idem ls, idem ui on a replica; on a
// standby, whether workers are alive is unknown: see ErrLivenessUnknown).
var ErrReadOnly = pgschema.ErrReadOnly

// An Option configures OpenJournal or OpenStore. Schema and
// WithoutMigration configure both; every other option names the one it
// configures, and the other refuses it.
type Option func(*options)

type options struct {
	schema   string
	migrate  bool
	readOnly bool

	// The journal's.
	maxBody  int
	maxBatch int
	liveness bool
	grace    time.Duration
	onCommit func(idem.CommitInfo)

	// The store's.
	deferCompletes bool

	journalOnly, storeOnly []string // the options given that only one of them takes
}

func newOptions(opts []Option) options {
	o := options{schema: "idem", migrate: true, maxBody: idem.DefaultMaxBodySize, maxBatch: 128, liveness: true, grace: DefaultLivenessGrace}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// check refuses an empty schema and the options that configure the other
// kind of table set.
func (o options) check(open string, others []string, other string) error {
	if len(others) > 0 {
		verb := "configures"
		if len(others) > 1 {
			verb = "configure"
		}
		return fmt.Errorf("postgres: %s %s %s, not %s", strings.Join(others, " and "), verb, other, open)
	}
	if o.schema == "" {
		return fmt.Errorf(`postgres: %s: Schema is empty; name a schema, such as "idem"`, open)
	}
	return nil
}

// Schema names the schema that holds the tables, created if need be.
// Defaults to "idem". The journal and the store may share one.
func Schema(name string) Option { return func(o *options) { o.schema = name } }

// WithoutMigration makes OpenJournal and OpenStore refuse tables that are
// missing or older than this build (ErrNotMigrated) instead of migrating
// them: for teams that migrate separately, with MigrateJournal and
// MigrateStore.
func WithoutMigration() Option { return func(o *options) { o.migrate = false } }

// ReadOnly opens the journal for reading only, as an operator's tool does
// (idem ls, idem ui): it is not migrated (as WithoutMigration), each of
// its reads runs in a transaction begun READ ONLY, so that the server
// refuses any write a statement of it would make, and its methods that
// write fail with ErrReadOnly without reaching the database. A
// transaction's access mode holds behind a pooler in transaction mode,
// where a session's default_transaction_read_only does not: PgBouncer
// refuses it as a startup parameter, and a SET of it would stay with
// whichever server session ran it, for the pooler's other clients.
// Journal only.
func ReadOnly() Option {
	return func(o *options) {
		o.readOnly, o.migrate = true, false
		o.journalOnly = append(o.journalOnly, "ReadOnly")
	}
}

// MaxBodySize sets the largest request body the journal accepts. Defaults
// to idem.DefaultMaxBodySize (1 MiB). Journal only.
func MaxBodySize(n int) Option {
	return func(o *options) { o.maxBody = n; o.journalOnly = append(o.journalOnly, "MaxBodySize") }
}

// MaxBatch sets the most journal writes committed in one transaction. 1
// commits every write on its own, for comparison. Defaults to 128.
// Journal only.
func MaxBatch(n int) Option {
	return func(o *options) { o.maxBatch = n; o.journalOnly = append(o.journalOnly, "MaxBatch") }
}

// WithoutLiveness makes the journal's Register record nothing: leases of
// workers that died are taken over only when they lapse. For a database,
// or a pooler's pool of server sessions, that cannot spare a connection
// per registered client: liveness holds one for each (a connection of its
// own, beside the pool's; see Register), behind a PgBouncer in
// transaction mode too (its lock is held in a transaction left open,
// which binds the server session to it). Journals with and without it may
// share a schema: those with liveness leave the operations of workers
// without it to lapse too. Journal only.
func WithoutLiveness() Option {
	return func(o *options) { o.liveness = false; o.journalOnly = append(o.journalOnly, "WithoutLiveness") }
}

// DefaultLivenessGrace is LivenessGrace's default.
const DefaultLivenessGrace = 2 * time.Second

// LivenessGrace sets how long an owner's liveness lock must stay free, in
// one session of the owner's, before the journal takes the owner for gone
// and its leases as free to take. An owner whose session ended while it
// lives on (its backend terminated, the database restarted, a pooler
// closed the connection) takes its lock again on a new session at once;
// the grace keeps others from taking its operations meanwhile. It counts
// from the first time a journal finds the lock free. It is how much later
// than at once a dead worker's operations are taken, and how long a worker
// cut off from the database keeps its operations (unless their leases
// lapse first). An owner that unregistered (Client.Close, Journal.Close)
// is gone at once. Zero takes a free lock for a gone owner. The grace
// that counts is that of the journal judging: give every worker of a
// fleet the same. Judged on the database's clock. Defaults to
// DefaultLivenessGrace (2 s). Journal only.
func LivenessGrace(d time.Duration) Option {
	return func(o *options) { o.grace = d; o.journalOnly = append(o.journalOnly, "LivenessGrace") }
}

// OnCommit calls fn after each transaction of writes the journal commits,
// on the goroutine that committed it (keep it fast): how many writes it
// carried, whether it waited for the WAL flush (synchronous_commit on),
// and how long from the start of the batch to the end of its commit. The
// otel module's JournalCommitHook is such a fn, as with
// idem.SQLiteOnCommit. Journal only.
func OnCommit(fn func(idem.CommitInfo)) Option {
	return func(o *options) { o.onCommit = fn; o.journalOnly = append(o.journalOnly, "OnCommit") }
}

// DeferCompletes makes the store commit completions without waiting for
// the WAL flush; see Store for what a crash of the database server then
// costs. Store only.
func DeferCompletes() Option {
	return func(o *options) { o.deferCompletes = true; o.storeOnly = append(o.storeOnly, "DeferCompletes") }
}

// notMigrated is the error of an open without migration that found the
// tables at version have instead of want.
func notMigrated(what, schema string, have, want int, migrate string) error {
	state := fmt.Sprintf("are at version %d", have)
	if have == 0 {
		state = "do not exist"
	}
	return fmt.Errorf("postgres %s in schema %q: %w: its tables %s, this build needs version %d; "+
		"run postgres.%s(ctx, pool, %q), or open without WithoutMigration",
		what, schema, ErrNotMigrated, state, want, migrate, schema)
}
