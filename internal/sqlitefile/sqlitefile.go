// Package sqlitefile holds the conventions every idem SQLite file follows,
// written once for the client's journal and the server's key store: the file
// is created 0600; it is identified by its application_id and versioned by
// its user_version, with migrations run on open; it runs in WAL mode with
// synchronous=FULL unless the caller explicitly asks for NORMAL, and both
// are read back after opening (the committer then runs at NORMAL and
// fsyncs the WAL itself after each commit that must be durable, as FULL
// would have inside it); one connection writes, through a group
// commit that also keeps the WAL bounded, while a pool of connections reads;
// a flusher makes deferred writes durable.
package sqlitefile

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	_ "github.com/mattn/go-sqlite3" // registers the "sqlite3" driver
)

// Options describe one kind of file.
type Options struct {
	// What names the file's role in messages, such as "journal".
	What string
	// AppID is the application_id that marks a file as ours.
	AppID int32
	// Migrations[i] takes the schema from version i to i+1. The file's
	// user_version is len(Migrations) once open.
	Migrations []string
	// SyncNormal commits with synchronous=NORMAL instead of FULL: a commit
	// does not wait for fsync, and a power failure may lose the last commits.
	SyncNormal bool
	// BusyTimeout bounds how long a statement waits for another process's
	// lock. Defaults to 10 s.
	BusyTimeout time.Duration
	// Readers is the size of the read pool. Defaults to 4.
	Readers int
	// MaxBatch is the most writes committed in one transaction. Defaults
	// to 256.
	MaxBatch int
	// FlushInterval bounds how long a deferred write may wait for its fsync.
	// Defaults to 1 s.
	FlushInterval time.Duration
	// LingerDelay bounds how long buffered writes wait in the open
	// transaction for another write to commit them. Defaults to 1 ms.
	LingerDelay time.Duration
	// WALLimit is the WAL size above which the committer truncates the WAL,
	// waiting a little for the readers in its way (see truncateIfLarge).
	// SQLite's own checkpoints keep it near 4 MB unless readers hold
	// them back. Defaults to 64 MiB.
	WALLimit int64
	// Closed is the error kind reported after Close. Defaults to ErrClosed.
	Closed error
	// MustExist refuses to create the file: opening a missing file fails
	// with ErrBadPath wrapping fs.ErrNotExist.
	MustExist bool
	// ReadOnly opens an existing file for reading only (see openReadOnly):
	// nothing is migrated, locked for writing or created, and Write fails
	// with ErrReadOnly. A file of an older schema is refused with
	// ErrSchemaTooOld.
	ReadOnly bool
	// OnRollback, if set, is called on the committer's goroutine whenever a
	// write (or a whole batch) is rolled back, before the next write runs:
	// a cache of what writes inserted must be dropped then.
	OnRollback func()
	// OnCommit, if set, is called on the committer's goroutine after each
	// commit, with what it carried.
	OnCommit func(Commit)
}

// Commit describes one committed transaction, for Options.OnCommit.
type Commit struct {
	// Writes is the number of writes the transaction committed.
	Writes int
	// Durable reports that the commit waited for fsync.
	Durable bool
	// Duration is the time from the start of the batch that committed to
	// the end of its commit: what its writers waited for, at most.
	Duration time.Duration
}

func (o *Options) withDefaults() {
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = 10 * time.Second
	}
	if o.Readers <= 0 {
		o.Readers = 4
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 256
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = time.Second
	}
	if o.LingerDelay <= 0 {
		o.LingerDelay = time.Millisecond
	}
	if o.WALLimit <= 0 {
		o.WALLimit = 64 << 20
	}
	if o.Closed == nil {
		o.Closed = ErrClosed
	}
}

// DB is an open idem SQLite file. Writes go through Write; reads through
// Reader. It is safe for concurrent use.
type DB struct {
	what, path string
	opts       Options

	writerDB *sql.DB
	writer   *sql.Conn // used by the leader of the group commit only
	ctl      control   // the writer's transaction statements, prepared once
	// Reader is the read pool. Its connections refuse writes.
	Reader *sql.DB

	// The group commit's queue. queueMu guards queue, leading and closed;
	// the leader alone uses batch, txFull, lastWALCheck, walCheckEvery and
	// the writer.
	queueMu sync.Mutex
	queue   []*writeReq
	leading bool
	closed  bool
	writers sync.WaitGroup // Write calls in progress
	batch   []*writeReq
	txFull  bool // the open transaction's commit waits for fsync
	// inTx says the writer is inside a transaction, begun at openedAt.
	// carried holds the buffered writes it carries, which have returned to
	// their callers; replay those that a failed commit rolled back, to be
	// run again. buffered says either is not empty, for goroutines other
	// than the leader.
	inTx     bool
	txWrites int // writes run in the open transaction, for OnCommit
	openedAt time.Time
	carried  []func(*Tx) error
	replay   []func(*Tx) error
	buffered atomic.Bool
	// linger commits buffered writes that no other write came to carry
	// within LingerDelay. The leader arms it once per transaction it leaves
	// open (lingerArmed): a timer, not a goroutine to wake, since at one
	// writer that is once per operation.
	linger      *time.Timer
	lingerArmed bool

	closing   chan struct{}
	closeOnce sync.Once
	closeErr  error
	wg        sync.WaitGroup

	stats   Stats
	statsMu sync.Mutex
	// unsynced is what the flusher must fsync: the time of the oldest
	// commit not yet known to be on disk (zero when none is), and a count
	// of the commits made without fsync, so that a flush clears only what
	// its fsync covered. The committer sets it rather than waking the
	// flusher: at one writer that was a goroutine's wake-up per operation,
	// for an fsync that the next durable commit usually makes.
	unsyncedMu    sync.Mutex
	unsyncedSince time.Time
	unsyncedN     int64

	lastWALCheck  time.Time
	walCheckEvery time.Duration // see truncateIfLarge; 0 is walCheckInterval

	// wal is the WAL file, open for fsync (syncWAL) from its first use.
	walMu    sync.Mutex
	wal      *os.File
	walSyncs int64 // for tests

	// readOnly is Options.ReadOnly: Reader alone is open.
	readOnly bool
}

// Path returns the file's path as given to Open, made absolute and with its
// symbolic links resolved (when it named a link to a file not yet created,
// the path of the file created): the file SQLite writes, beside which its
// -wal and -shm are, whatever link each process sharing it was given. Files
// kept beside it are named from this path.
func (db *DB) Path() string { return db.path }

// Open opens or creates the file at path. It refuses, changing nothing, a
// directory, a path whose directory does not exist or is not writable,
// another program's database, a file that is not SQLite, a file with
// another name (a hard link: see checkNames), and a schema newer than
// opts.Migrations.
func Open(ctx context.Context, path string, opts Options) (*DB, error) {
	opts.withDefaults()
	if path == "" {
		return nil, &Error{What: opts.What, Path: `""`, Kind: ErrBadPath, Hint: "give the path of a file, such as ./idem.db"}
	}
	abs, err := resolve(path)
	if err != nil {
		return nil, &Error{What: opts.What, Path: path, Kind: ErrBadPath, Err: err,
			Hint: "check the symbolic links along the path"}
	}
	db := &DB{what: opts.What, path: abs, opts: opts}
	if opts.ReadOnly {
		return db, db.openReadOnly(ctx)
	}
	if err := db.prepareFile(ctx); err != nil {
		return nil, err
	}
	if err := db.open(ctx); err != nil {
		db.closeDBs()
		return nil, db.openError(err)
	}
	db.closing = make(chan struct{})
	db.linger = time.AfterFunc(time.Hour, func() {
		// Fails only once Close has begun, and Close commits them.
		_ = db.CommitBuffered(context.Background())
	})
	db.linger.Stop()
	db.wg.Add(1)
	go db.flushLoop()
	return db, nil
}

// openError makes every failure to open the file a *Error. A lock another
// process held past the busy timeout is ErrLocked; one that SQLite
// reports without a kind of its own (an unsupported file format, a schema it
// cannot parse) means the file is not one this build can use.
func (db *DB) openError(err error) error {
	if fe := (*Error)(nil); errors.As(err, &fe) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err // says what it is
	}
	if isBusy(err) {
		return db.locked("a lock on the file", err)
	}
	return &Error{What: db.what, Path: db.path, Kind: ErrForeign, Err: err,
		Hint: "not an SQLite database this build can read, or its header is damaged; check the path"}
}

// prepareFile checks the path and creates the file with mode 0600 when it
// does not exist (see create), so that SQLite never creates it with the
// process umask. SQLite gives the -wal and -shm files the same mode as the
// database. It never opens the path itself: see canReadWrite.
func (db *DB) prepareFile(ctx context.Context) error {
	bad := func(err error, hint string) error {
		return &Error{What: db.what, Path: db.path, Kind: ErrBadPath, Err: err, Hint: hint}
	}
	fi, err := os.Stat(db.path)
	switch {
	case err == nil && fi.IsDir():
		return bad(errors.New("is a directory"), "give the path of a file inside it, such as "+filepath.Join(db.path, "idem.db"))
	case err == nil && !fi.Mode().IsRegular():
		return bad(errors.New("is not a regular file"), "give the path of a regular file")
	case err == nil && db.opts.MustExist && fi.Size() == 0 && !nonEmpty(db.path+"-wal"):
		// SQLite would take an empty file for a new database; a tool that
		// must not create one must not adopt one either. (A file an older
		// build had just created held nothing until its WAL was
		// checkpointed, so a non-empty WAL beside it counts; this build
		// creates the file whole: see create.)
		return &Error{What: db.what, Path: db.path, Kind: ErrForeign, Err: errors.New("the file is empty"),
			Hint: "check the path; an empty file is not a " + db.what}
	case err == nil:
		if err := db.checkNames(fi); err != nil {
			return err
		}
		if err := canReadWrite(db.path); err != nil {
			return bad(err, "the file must be readable and writable by this process")
		}
		return nil
	case errors.Is(err, fs.ErrNotExist) && db.opts.MustExist:
		return bad(fs.ErrNotExist, "check the path; it is not created when it is missing")
	case errors.Is(err, fs.ErrNotExist):
		dir := filepath.Dir(db.path)
		if di, err := os.Stat(dir); err != nil || !di.IsDir() {
			if err == nil {
				err = errors.New(dir + " is not a directory")
			}
			return bad(err, "create the directory first, or choose another path")
		}
		return db.create(ctx, dir)
	default:
		return bad(err, "check the path and its permissions")
	}
}

func nonEmpty(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Size() > 0
}

func (db *DB) dsn(extra ...string) string {
	sync := "FULL"
	if db.opts.SyncNormal {
		sync = "NORMAL"
	}
	q := url.Values{}
	q.Set("_busy_timeout", fmt.Sprint(db.opts.BusyTimeout.Milliseconds()))
	q.Set("_synchronous", sync)
	q.Set("_stmt_cache_size", "64")
	q.Set("_cache_size", "-16384")
	for i := 0; i+1 < len(extra); i += 2 {
		q.Set(extra[i], extra[i+1])
	}
	uri, _ := URI(db.path, q) // db.path is absolute: nothing to fail
	return uri
}

// URI is the file: URI, with query q, by which SQLite opens the file at
// path, made absolute (a relative path would read as an authority,
// "file://ops.db", which SQLite refuses) and escaped ('?', '#', '%' and
// spaces included). Every connection of this package, and the CLI's own,
// is opened by it.
func URI(path string, q url.Values) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(abs), RawQuery: q.Encode()}
	return u.String(), nil
}

func (db *DB) open(ctx context.Context) error {
	var err error
	if db.writerDB, err = sql.Open("sqlite3", db.dsn()); err != nil {
		return db.classify(err)
	}
	db.writerDB.SetMaxOpenConns(1)
	db.writerDB.SetConnMaxLifetime(0)
	if db.writer, err = db.writerDB.Conn(ctx); err != nil {
		return db.classify(err)
	}
	if err := db.checkIdentity(ctx); err != nil {
		return err
	}
	// WAL is a property of the file: set it only once the file is known to
	// be ours, so that a foreign file is left exactly as it was; and after
	// the migrations, whose failure (tables that do not match the file's
	// schema version) rolls back all they did, and must leave the file as
	// it was too.
	if err := db.migrate(ctx); err != nil {
		return err
	}
	if err := db.setWAL(ctx, db.writer); err != nil {
		return err
	}
	if err := db.checkSync(ctx, db.writer); err != nil {
		return err
	}
	// The committer's transactions run at NORMAL, and those that must be
	// durable fsync the WAL after their COMMIT (see commit). Not a prepared
	// statement: SQLite applies this pragma when it compiles it.
	if _, err := db.writer.ExecContext(ctx, "PRAGMA synchronous=NORMAL"); err != nil {
		return db.classify(err)
	}
	if err := db.prepareControl(ctx); err != nil {
		return err
	}
	// When the WAL restarts from its beginning, cut the file back to the
	// limit: a burst that grew it must not leave it that large for good.
	if _, err := db.writer.ExecContext(ctx, fmt.Sprintf("PRAGMA journal_size_limit=%d", db.opts.WALLimit)); err != nil {
		return db.classify(err)
	}
	// From here on the committer waits for other processes' write locks by
	// itself (see begin): SQLite's busy handler sleeps up to 100 ms between
	// tries, which lets a busy process starve another.
	if _, err := db.writer.ExecContext(ctx, "PRAGMA busy_timeout=0"); err != nil {
		return db.classify(err)
	}
	if db.Reader, err = sql.Open("sqlite3", db.dsn("_query_only", "1")); err != nil {
		return db.classify(err)
	}
	db.Reader.SetMaxOpenConns(db.opts.Readers)
	db.Reader.SetMaxIdleConns(db.opts.Readers)
	return nil
}

// control holds the statements every batch runs, prepared once on the
// writer: the driver parses a statement without arguments anew on every
// call, and these run several times per write. (PRAGMA synchronous cannot
// be among them: SQLite applies it when it compiles the statement.)
type control struct {
	begin, commit, rollback, savepoint, release, rollbackTo *sql.Stmt
}

func (db *DB) prepareControl(ctx context.Context) error {
	for _, p := range []struct {
		stmt **sql.Stmt
		sql  string
	}{
		{&db.ctl.begin, "BEGIN IMMEDIATE"}, {&db.ctl.commit, "COMMIT"}, {&db.ctl.rollback, "ROLLBACK"},
		{&db.ctl.savepoint, "SAVEPOINT w"}, {&db.ctl.release, "RELEASE w"}, {&db.ctl.rollbackTo, "ROLLBACK TO w"},
	} {
		stmt, err := db.writer.PrepareContext(ctx, p.sql)
		if err != nil {
			return db.classify(err)
		}
		*p.stmt = stmt
	}
	return nil
}

// checkIdentity refuses files that are not ours before anything writes to
// them.
func (db *DB) checkIdentity(ctx context.Context) error {
	_, err := db.identity(ctx, db.writer)
	return err
}

// identity reads the file's schema version on c, refusing files that are
// not ours, damaged markings and newer schemas. A new, empty file is
// version 0.
func (db *DB) identity(ctx context.Context, c *sql.Conn) (int, error) {
	var appID int32
	var version, tables int
	row := c.QueryRowContext(ctx, `SELECT (SELECT application_id FROM pragma_application_id),
		(SELECT user_version FROM pragma_user_version),
		(SELECT count(*) FROM sqlite_schema)`)
	if err := row.Scan(&appID, &version, &tables); err != nil {
		return 0, db.classify(err)
	}
	switch {
	case appID == 0 && version == 0 && tables == 0:
		return 0, nil // empty: a new file
	case appID == db.opts.AppID && version < 0:
		return 0, &Error{What: db.what, Path: db.path, Kind: ErrCorrupt,
			Err:  fmt.Errorf("negative schema version %d", version),
			Hint: "restore a backup, or move it aside to start a new one"}
	case appID == db.opts.AppID && version == 0:
		// Open sets both in one transaction: one without the other is a
		// damaged file, not a new one.
		return 0, &Error{What: db.what, Path: db.path, Kind: ErrCorrupt,
			Err:  fmt.Errorf("marked as an idem %s but without a schema version (%d tables)", db.what, tables),
			Hint: "restore a backup, or move it aside to start a new one"}
	case appID != db.opts.AppID && kinds[appID].what != "":
		k := kinds[appID]
		return 0, &Error{What: db.what, Path: db.path, Kind: ErrForeign,
			Err:  fmt.Errorf("it is an idem %s (%s), not a %s", k.what, k.whose, db.what),
			Hint: fmt.Sprintf("give the %s's path; %s", db.what, k.hint)}
	case appID != db.opts.AppID:
		return 0, &Error{What: db.what, Path: db.path, Kind: ErrForeign,
			Err:  fmt.Errorf("SQLite database with application_id %#x and %d tables", appID, tables),
			Hint: "it belongs to another program; choose another path"}
	case version > len(db.opts.Migrations):
		return 0, &Error{What: db.what, Path: db.path, Kind: ErrSchemaTooNew,
			Err:  fmt.Errorf("schema version %d, this build supports up to %d", version, len(db.opts.Migrations)),
			Hint: "upgrade idem to a version that wrote it"}
	}
	return version, nil
}

// setWAL switches the file to WAL. The switch takes the file's exclusive
// lock from within the read transaction it begins, and SQLite does not call
// its busy handler for that upgrade while another connection holds the
// reserved lock (each would wait for the other): when processes open a new
// file together, all but one of those reaching the switch at once fail at
// once. So it is tried again, like a write waiting for the lock.
func (db *DB) setWAL(ctx context.Context, c *sql.Conn) error {
	var mode string
	if err := db.whileBusy(func() error {
		return c.QueryRowContext(ctx, "PRAGMA journal_mode=WAL").Scan(&mode)
	}); err != nil {
		return err
	}
	if !strings.EqualFold(mode, "wal") {
		return &Error{What: db.what, Path: db.path, Kind: ErrBadPath,
			Err:  fmt.Errorf("journal_mode is %q after asking for WAL", mode),
			Hint: "the file system does not support SQLite's WAL mode (network file systems often do not); use a local disk"}
	}
	return nil
}

// checkSync reads synchronous back: the driver's own default is NORMAL,
// which can lose a just-committed intent on power loss, so a connection
// that is not what was asked for is refused.
func (db *DB) checkSync(ctx context.Context, c *sql.Conn) error {
	want := 2 // FULL
	if db.opts.SyncNormal {
		want = 1
	}
	var got int
	if err := c.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&got); err != nil {
		return db.classify(err)
	}
	if got != want {
		return &Error{What: db.what, Path: db.path, Kind: ErrBadPath,
			Err:  fmt.Errorf("synchronous is %d after asking for %d", got, want),
			Hint: "the SQLite driver did not apply the durability setting; this build cannot guarantee durable writes"}
	}
	return nil
}

// migrate brings the schema to len(Migrations) in one immediate
// transaction, re-reading the version inside it so that two processes
// opening a new file at once migrate it once.
func (db *DB) migrate(ctx context.Context) (err error) {
	if _, err := db.writer.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return db.classify(err)
	}
	defer func() {
		if err != nil {
			_, _ = db.writer.ExecContext(context.Background(), "ROLLBACK")
		}
	}()
	var version int
	if err := db.writer.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return db.classify(err)
	}
	if version < 0 {
		return &Error{What: db.what, Path: db.path, Kind: ErrCorrupt,
			Err: fmt.Errorf("negative schema version %d", version), Hint: "restore a backup"}
	}
	if version > len(db.opts.Migrations) {
		return &Error{What: db.what, Path: db.path, Kind: ErrSchemaTooNew,
			Err:  fmt.Errorf("schema version %d, this build supports up to %d", version, len(db.opts.Migrations)),
			Hint: "upgrade idem to a version that wrote it"}
	}
	if version == len(db.opts.Migrations) {
		_, err := db.writer.ExecContext(ctx, "ROLLBACK")
		return db.classify(err)
	}
	for v := version; v < len(db.opts.Migrations); v++ {
		if _, err := db.writer.ExecContext(ctx, db.opts.Migrations[v]); err != nil {
			err = db.classify(err)
			if fe := (*Error)(nil); errors.As(err, &fe) {
				return err
			}
			return &Error{What: db.what, Path: db.path, Kind: ErrCorrupt,
				Err:  fmt.Errorf("migrating schema %d to %d: %w", v, v+1, err),
				Hint: "its tables do not match its schema version; restore a backup"}
		}
	}
	stmt := fmt.Sprintf("PRAGMA application_id=%d; PRAGMA user_version=%d", db.opts.AppID, len(db.opts.Migrations))
	if _, err := db.writer.ExecContext(ctx, stmt); err != nil {
		return db.classify(err)
	}
	if _, err := db.writer.ExecContext(ctx, "COMMIT"); err != nil {
		return db.classify(err)
	}
	return nil
}

// Close stops the committer and the checkpointer, makes every deferred
// write durable, and closes the connections. Writes queued behind Close
// fail with ErrClosed.
func (db *DB) Close() error {
	if db.readOnly {
		db.closeOnce.Do(func() {
			db.queueMu.Lock()
			db.closed = true
			db.queueMu.Unlock()
			db.closeErr = db.Reader.Close()
		})
		return db.closeErr
	}
	db.closeOnce.Do(func() {
		db.queueMu.Lock()
		db.closed = true
		db.queueMu.Unlock()
		db.writers.Wait() // writes queued before Close are committed
		close(db.closing)
		db.wg.Wait()
		db.linger.Stop()
		var err error
		if !db.inTx && len(db.replay) > 0 {
			err = db.beginTx(true)
		}
		if db.inTx {
			// Buffered writes that no write came to carry.
			err = errors.Join(err, db.commit())
		}
		// What deferred commits left in the WAL is made durable by an fsync
		// of the WAL itself: the checkpoint below cannot be relied on for
		// it, as another process's read transaction stops a PASSIVE
		// checkpoint short (and it syncs nothing then), and the WAL
		// outlives this process's connections while another has the file
		// open.
		var serr error
		if err := db.syncWAL(); err != nil {
			serr = fmt.Errorf("idem %s %s: %w: %w", db.what, db.path, errNotSynced, err)
		}
		// The checkpoint keeps the WAL short for the next opener.
		_, cerr := db.writer.ExecContext(context.Background(), "PRAGMA wal_checkpoint(PASSIVE)")
		db.closeErr = errors.Join(err, serr, db.classify(cerr), db.closeDBs())
	})
	return db.closeErr
}

func (db *DB) closeDBs() error {
	var errs []error
	for _, stmt := range []*sql.Stmt{db.ctl.begin, db.ctl.commit, db.ctl.rollback, db.ctl.savepoint,
		db.ctl.release, db.ctl.rollbackTo} {
		if stmt != nil {
			errs = append(errs, stmt.Close())
		}
	}
	if db.writer != nil {
		errs = append(errs, db.writer.Close())
	}
	for _, d := range []*sql.DB{db.writerDB, db.Reader} {
		if d != nil {
			errs = append(errs, d.Close())
		}
	}
	db.walMu.Lock()
	if db.wal != nil {
		errs = append(errs, db.wal.Close())
		db.wal = nil
	}
	db.walMu.Unlock()
	return errors.Join(errs...)
}

// ErrIfClosed returns Options.Closed once Close has begun.
func (db *DB) ErrIfClosed() error {
	db.queueMu.Lock()
	defer db.queueMu.Unlock()
	if db.closed {
		return db.opts.Closed
	}
	return nil
}

// Classify maps err as the DB's own failures are mapped: corruption, a full
// disk, a foreign file and permission problems become an *Error naming the
// file and what to do.
func (db *DB) Classify(err error) error { return db.classify(err) }

// syncDir fsyncs a directory, so that the entries made in it are durable.
// A file system that cannot sync a directory (some refuse it) is taken at
// its word: there is nothing more to do.
func syncDir(d *os.File) error {
	if err := d.Sync(); err != nil && !errors.Is(err, errors.ErrUnsupported) && !errors.Is(err, syscall.EINVAL) {
		return err
	}
	return nil
}
