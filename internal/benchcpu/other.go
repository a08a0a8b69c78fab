//go:build !(linux || darwin || freebsd || netbsd || openbsd)

// Package benchcpu measures the CPU time a benchmark's process uses, for
// the cpu-µs/op figures of the root and server benchmarks.
package benchcpu

import "time"

// Process is not measured on this system: benchmarks report no CPU time.
func Process() (time.Duration, bool) { return 0, false }
