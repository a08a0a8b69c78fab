package sqlitefile

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Creators and the removal of what dead ones left agree through a lock on
// the directory (flock, see dirlock_flock.go), not on each temporary file:
// a creator holds it shared from before it makes its temporary file until
// it has removed it, so no instant exists at which a live creator's file
// is in the directory unlocked; removeLeftovers takes it exclusive, which
// it gets only while no creator of this build is at work in the
// directory, and then every temporary file there is a dead one's. (A lock
// on the temporary file itself could only be taken once the file exists:
// a remover coming in between would take a live creator's file for a dead
// one's.) The lock is flock's, on the directory: SQLite's own locks are
// POSIX locks on the files, which flock neither takes nor drops, and
// which closing a descriptor of the directory does not touch.

// lockPoll is how often a creator tries again for its shared lock while a
// remover holds the directory (for as long as a few unlinks take).
const lockPoll = 5 * time.Millisecond

// lockDirShared takes the directory's shared lock for a creator, waiting
// for a remover at most the busy timeout. It returns the function that
// releases it. Where the lock cannot be taken at all (a file system
// without flock), the creator goes on without it, as removers there find
// no lock to take either and remove nothing.
func (db *DB) lockDirShared(ctx context.Context, dir string) (unlock func(), err error) {
	deadline := time.Now().Add(db.opts.BusyTimeout)
	for {
		unlock, busy, err := tryLockDir(dir, false)
		switch {
		case err != nil:
			return func() {}, nil
		case !busy:
			return unlock, nil
		case time.Now().After(deadline):
			return nil, &Error{What: db.what, Path: db.path, Kind: ErrLocked,
				Err:  fmt.Errorf("waited %s for a shared lock on its directory %s", db.opts.BusyTimeout, dir),
				Hint: "another process holds an exclusive flock on the directory; find it (fuser " + dir + ") and end it, or let opens wait longer (SQLiteBusyTimeout); nothing was created"}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(lockPoll):
		}
	}
}

// removeLeftovers removes the temporary files (tempPrefix, and the
// -journal, -wal and -shm SQLite made beside them) that creators killed
// while they built a file left in dir, if it can take the directory's
// exclusive lock: then no creator is at work there. If it cannot, a
// creator is, and a later open removes them. It is done once a file is
// opened for writing (never read-only, nor when the open is refused), and
// nothing of it can fail the open: a file it could not remove stays as it
// was.
func removeLeftovers(dir string) {
	if !hasLeftovers(dir) {
		return
	}
	unlock, busy, err := tryLockDir(dir, true)
	if err != nil || busy {
		return
	}
	defer unlock()
	des, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, de := range des {
		if strings.HasPrefix(de.Name(), tempPrefix) && de.Type().IsRegular() {
			_ = os.Remove(filepath.Join(dir, de.Name()))
		}
	}
}

func hasLeftovers(dir string) bool {
	m, err := filepath.Glob(filepath.Join(globEscape(dir), tempPrefix+"*"))
	return err == nil && len(m) > 0
}

// globEscape escapes the characters filepath.Glob reads as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
