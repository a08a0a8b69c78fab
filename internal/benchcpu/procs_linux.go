package benchcpu

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of /proc/<pid>/stat's utime and stime: USER_HZ,
// 100 on every Linux architecture Go runs on (sysconf(_SC_CLK_TCK) is not
// reachable without cgo).
const clockTick = 10 * time.Millisecond

// Processes returns the CPU time, user and system, that each of pids has
// used so far, read from /proc/<pid>/stat, for the CPU of other processes
// a benchmark drives (the PostgreSQL backends serving its connections). A
// pid that no longer exists is left out; the figures are in clock ticks of
// 10 ms, so a benchmark compares them over seconds, not microseconds.
func Processes(pids []int) map[int]time.Duration {
	out := make(map[int]time.Duration, len(pids))
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		// The command name, field 2, is in parentheses and may hold
		// spaces: count fields from after its closing one.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		// f[0] is field 3 (state); utime and stime are fields 14 and 15.
		if len(f) < 13 {
			continue
		}
		u, err1 := strconv.ParseInt(f[11], 10, 64)
		st, err2 := strconv.ParseInt(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		out[pid] = time.Duration(u+st) * clockTick
	}
	return out
}
