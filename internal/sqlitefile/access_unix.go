//go:build unix

package sqlitefile

import (
	"io/fs"
	"syscall"
)

// canReadWrite checks that this process may read and write the file at
// path without opening it. Opening and closing it would not do: closing
// any descriptor of a file drops every POSIX lock the process holds on it,
// those of SQLite connections of other handles in this process included
// (SQLite's "POSIX advisory locks canceled by a separate thread doing
// close()"), and two connections would then write the file at once.
// access(2) judges by the real rather than the effective user, which only
// a set-user-ID program would notice.
func canReadWrite(path string) error {
	const rOK, wOK = 4, 2
	if err := syscall.Access(path, rOK|wOK); err != nil {
		return &fs.PathError{Op: "access", Path: path, Err: err}
	}
	return nil
}
