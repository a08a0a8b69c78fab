package sqlitefile

import (
	"context"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sharedLockHeld reports whether a POSIX read lock covers SQLite's shared
// range of the file f names (SHARED_FIRST, 510 bytes past 1 GiB + 2),
// asked as an open file description lock: those conflict with this
// process's own POSIX locks, which a plain F_GETLK would not report.
func sharedLockHeld(t *testing.T, f *os.File) bool {
	t.Helper()
	const fOFDGetlk = 36 // F_OFD_GETLK, Linux 3.15
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: 0, Start: 0x40000002, Len: 510}
	require.NoError(t, syscall.FcntlFlock(f.Fd(), fOFDGetlk, &lk))
	return lk.Type != syscall.F_UNLCK
}

// A connection to a file in WAL mode keeps a shared lock on it for as
// long as it is open, and a process that closes its last connection
// deletes the WAL only if it can lock the file exclusively: a process
// whose locks were dropped has its WAL deleted under it. Opening another
// handle on the file, read-write or read-only, must not close any
// descriptor of it (which would drop all of this process's locks on it).
func TestOpeningAnotherHandleKeepsThisProcesssLocks(t *testing.T) {
	for _, ro := range []bool{false, true} {
		t.Run(map[bool]string{false: "read-write", true: "read-only"}[ro], func(t *testing.T) {
			db := openTest(t)
			require.NoError(t, db.Write(context.Background(), Durable, put("k", "v")))
			_, _ = get(t, db, "k")
			probe, err := os.Open(db.Path()) // closed last, after every handle
			require.NoError(t, err)
			defer probe.Close()
			require.True(t, sharedLockHeld(t, probe), "an open handle holds the file's shared lock")

			o := db.opts
			o.ReadOnly = ro
			other, err := Open(context.Background(), db.Path(), o)
			require.NoError(t, err)
			assert.True(t, sharedLockHeld(t, probe), "opening a second handle dropped the first's lock")
			require.NoError(t, other.Close())
			require.NoError(t, db.Close())
		})
	}
}
