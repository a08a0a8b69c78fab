package idem

import (
	"testing"
	"time"
)

// backoff never panics, whatever policy reaches it, and stays within
// [0, MaxBackoff] when MaxBackoff is not negative: a policy New would
// refuse (MaxBackoff 5 ns below MinBackoff 100 ms made rand.N panic on
// the caller's goroutine) gets a wait, not a crash.
func TestBackoffNeverPanics(t *testing.T) {
	for _, p := range []RetryPolicy{
		{MinBackoff: 100 * time.Millisecond, MaxBackoff: 5},
		{MinBackoff: 20 * time.Second, MaxBackoff: 5 * time.Second},
		{MinBackoff: -time.Second, MaxBackoff: time.Second},
		{MinBackoff: time.Second, MaxBackoff: -time.Second},
		{},
		{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond},
	} {
		for _, n := range []int{-1, 0, 1, 2, 40, 1 << 20} {
			d := p.backoff(n)
			if d < 0 || (p.MaxBackoff >= 0 && d > p.MaxBackoff) {
				t.Errorf("%+v: backoff(%d) = %s, want within [0, %s]", p, n, d, p.MaxBackoff)
			}
		}
	}
}
