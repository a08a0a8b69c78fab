package wire

import (
	"time"
)

// IsToken reports whether s is an RFC 9110 token, as a method or a header
// name must be.
func IsToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isTChar(s[i]) {
			return false
		}
	}
	return true
}

// Millis is how journals keep a time: milliseconds since the Unix epoch,
// 0 for the zero time.
func Millis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// NullMillis is Millis for a nullable column: nil for the zero time.
func NullMillis(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMilli()
}

// FromMillis reads what Millis wrote.
func FromMillis(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// NonNil is b, or an empty slice for nil: a NOT NULL column's value.
func NonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
