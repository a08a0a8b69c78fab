//go:build linux || darwin || freebsd || netbsd || openbsd

package server_test

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time, user and system, that the whole process
// has used so far, and true; every goroutine and thread counts, the
// loopback server's and its clients' too.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
