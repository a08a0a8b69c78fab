//go:build linux || darwin || freebsd || netbsd || openbsd

// Package benchcpu measures the CPU time a benchmark's process uses, for
// the cpu-µs/op figures of the root and server benchmarks.
package benchcpu

import (
	"syscall"
	"time"
)

// Process returns the CPU time, user and system, that the whole process
// has used so far, and true; every goroutine and thread counts, a loopback
// server's and its clients' in the same process too.
func Process() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
