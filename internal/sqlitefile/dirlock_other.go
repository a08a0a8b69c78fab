//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package sqlitefile

import "errors"

var errNoFlock = errors.New("no flock on this system")

// tryLockDir cannot lock here: creators go on without the lock, and
// removeLeftovers, finding no lock to take, removes nothing (a dead
// creator's temporary file stays, as it always did).
func tryLockDir(string, bool) (func(), bool, error) { return nil, false, errNoFlock }
