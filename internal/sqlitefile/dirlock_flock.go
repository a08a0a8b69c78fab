//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package sqlitefile

import (
	"errors"
	"os"
	"syscall"
)

// tryLockDir takes flock's lock on the directory dir without waiting,
// exclusive or shared. busy says another process holds one that
// conflicts; err that none can be taken there.
func tryLockDir(dir string, exclusive bool) (unlock func(), busy bool, err error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, false, err
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	for {
		err = syscall.Flock(int(d.Fd()), how|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	switch {
	case err == nil:
		// Closing the descriptor releases the lock.
		return func() { _ = d.Close() }, false, nil
	case errors.Is(err, syscall.EWOULDBLOCK):
		_ = d.Close()
		return nil, true, nil
	default:
		_ = d.Close()
		return nil, false, err
	}
}
