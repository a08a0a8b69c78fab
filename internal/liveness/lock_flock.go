//go:build linux || darwin || freebsd || openbsd || netbsd || dragonfly

package liveness

import (
	"os"
	"syscall"
)

const supported = true

// lock takes an exclusive flock on f without waiting. hold keeps it until
// f is closed; otherwise it is dropped at once (a probe). flock locks
// belong to the open file, so a probe from the same process still
// conflicts with a registration's lock.
func lock(f *os.File, hold bool) error {
	fd := int(f.Fd())
	if err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return err
	}
	if !hold {
		return syscall.Flock(fd, syscall.LOCK_UN)
	}
	return nil
}
