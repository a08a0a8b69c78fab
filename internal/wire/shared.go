package wire

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
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

// Fingerprint returns the hex SHA-256 of fields, each written as an 8-byte
// big-endian length followed by its bytes, so that no two different lists
// of fields share an encoding. The client and the server fingerprint
// different fields of a request with it; each is documented where it is
// computed, and neither may change without a new version of its fields.
func Fingerprint(fields ...[]byte) string {
	h := sha256.New()
	var n [8]byte
	for _, f := range fields {
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write(f)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// JoinValues joins a header's values for hashing: NUL cannot occur in a
// header value, so the join is unambiguous.
func JoinValues(values []string) string { return strings.Join(values, "\x00") }

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
