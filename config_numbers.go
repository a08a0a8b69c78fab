package idem

import (
	"errors"
	"fmt"
	"math"
)

// checkNumbers refuses, with ErrInvalidConfig naming the field, a count,
// size or rate of c that has no meaning: negative, or for a rate NaN or
// infinite. Zero stays zero, for New and RetryPolicy.withDefaults to set
// its default; a negative value is refused rather than taken for zero, as
// a MaxAttempts of -1 meant as "never retry" would retry five times.
func (c *Config) checkNumbers() error {
	var errs []error
	bad := func(name, why string) {
		errs = append(errs, fmt.Errorf("%w: Config.%s %s; leave it zero for its default", ErrInvalidConfig, name, why))
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"MaxResponseBytes", c.MaxResponseBytes},
		{"ResumeConcurrency", int64(c.ResumeConcurrency)},
		{"Retry.MaxAttempts", int64(c.Retry.MaxAttempts)},
		{"Retry.MaxStatusChecks", int64(c.Retry.MaxStatusChecks)},
	} {
		if f.v < 0 {
			bad(f.name, fmt.Sprintf("is negative (%d)", f.v))
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"Retry.RetryRatio", c.Retry.RetryRatio},
		{"Retry.MinRetriesPerSecond", c.Retry.MinRetriesPerSecond},
	} {
		switch {
		case math.IsNaN(f.v) || math.IsInf(f.v, 0):
			bad(f.name, fmt.Sprintf("is %v", f.v))
		case f.v < 0:
			bad(f.name, fmt.Sprintf("is negative (%v)", f.v))
		}
	}
	return errors.Join(errs...)
}
