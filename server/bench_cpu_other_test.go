//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package server_test

import "time"

// processCPU is not measured on this system: benchmarks report no CPU time.
func processCPU() (time.Duration, bool) { return 0, false }
