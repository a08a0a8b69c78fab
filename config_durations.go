package idem

import (
	"errors"
	"fmt"
	"time"
)

// minDuration is the shortest duration New accepts in any duration field
// of Config or RetryPolicy: a network call, a journal write or a status
// check takes longer, so a shorter value is a bare number meant in another
// unit (AttemptTimeout: 30 is 30 ns, not 30 s), which would fail every
// call, spin a background loop or switch off the protection silently.
const minDuration = time.Millisecond

// minLeaseDuration is the shortest LeaseDuration New accepts: the client
// renews its leases every third of it with a journal write (an fsync, or a
// PostgreSQL round trip), so a shorter lease lapses during one write it
// needs, and its renewer writes hundreds of times a second.
const minLeaseDuration = 100 * time.Millisecond

// durationField is one duration of Config or RetryPolicy that New checks
// and defaults, all by one rule (checkDurations).
type durationField struct {
	name string // as the user writes it: "LeaseDuration", "Retry.Budget"
	v    *time.Duration
	def  time.Duration // for zero; 0 keeps zero (ResumeInterval: off)
	min  time.Duration
	unit string // the unit a bare number most likely meant
	why  string // why min, when it is above minDuration
}

// durationFields lists every duration New checks; a new duration field of
// Config or RetryPolicy belongs here.
func (c *Config) durationFields() []durationField {
	r := &c.Retry
	return []durationField{
		{"Retention", &c.Retention, 24 * time.Hour, minDuration, "time.Hour", ""},
		{"AttemptTimeout", &c.AttemptTimeout, 30 * time.Second, minDuration, "time.Second", ""},
		{"LeaseDuration", &c.LeaseDuration, 15 * time.Second, minLeaseDuration, "time.Second",
			"the client renews its leases every third of it with a journal write"},
		{"ResumeInterval", &c.ResumeInterval, 0, minDuration, "time.Second", ""},
		{"Retry.MinBackoff", &r.MinBackoff, 100 * time.Millisecond, minDuration, "time.Millisecond", ""},
		{"Retry.MaxBackoff", &r.MaxBackoff, 5 * time.Second, minDuration, "time.Second", ""},
		{"Retry.MaxRetryAfter", &r.MaxRetryAfter, 30 * time.Second, minDuration, "time.Second", ""},
		{"Retry.Budget", &r.Budget, 30 * time.Second, minDuration, "time.Second", ""},
	}
}

// checkDurations sets every zero duration of c to its default and refuses,
// with ErrInvalidConfig naming the field, one that is negative (no
// duration has a meaning for a negative value) or below its minimum, and
// a MaxBackoff below MinBackoff.
func (c *Config) checkDurations() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: Config."+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	for _, f := range c.durationFields() {
		switch d := *f.v; {
		case d == 0:
			*f.v = f.def
		case d < 0:
			bad("%s is negative (%s); leave it zero for its default", f.name, d)
		case d < minDuration:
			bad("%s is %s: a time.Duration counts nanoseconds; did you mean %d * %s? "+
				"Durations below %s are refused as unit mistakes", f.name, d, int64(d), f.unit, minDuration)
		case d < f.min:
			bad("%s is %s, shorter than its minimum of %s: %s", f.name, d, f.min, f.why)
		}
	}
	// The jitter of RetryPolicy.backoff draws between MinBackoff/2 and
	// MaxBackoff; the other way round, no wait is both. One of the two may
	// be a default the user did not see, so the message gives both.
	if len(errs) == 0 && c.Retry.MaxBackoff < c.Retry.MinBackoff {
		bad("Retry.MaxBackoff (%s) is below Config.Retry.MinBackoff (%s); "+
			"a zero one is its default (100ms and 5s): set both", c.Retry.MaxBackoff, c.Retry.MinBackoff)
	}
	return errors.Join(errs...)
}
