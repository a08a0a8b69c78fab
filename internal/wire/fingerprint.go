package wire

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"sync"
)

// A Fingerprint is the hex SHA-256 of a list of fields, each written as an
// 8-byte big-endian length followed by its bytes, so that no two different
// lists of fields share an encoding. The client and the server fingerprint
// different fields of a request with it; each is documented where it is
// computed, and neither may change without a new version of its fields.
//
// A Fingerprint is taken from a pool (NewFingerprint), fed its fields in
// order, and returned to the pool by Sum: one allocation in all, the
// string Sum returns, where hashing copies of the fields cost one each.
type Fingerprint struct {
	h   hash.Hash
	buf []byte // fields not yet written to h, with their length prefixes
	sum [sha256.Size]byte
}

var fingerprints = sync.Pool{New: func() any { return &Fingerprint{h: sha256.New()} }}

// NewFingerprint returns an empty Fingerprint.
func NewFingerprint() *Fingerprint {
	f := fingerprints.Get().(*Fingerprint)
	f.h.Reset()
	f.buf = f.buf[:0]
	return f
}

// String adds a field.
func (f *Fingerprint) String(s string) {
	f.buf = binary.BigEndian.AppendUint64(f.buf, uint64(len(s)))
	f.buf = append(f.buf, s...)
}

// Values adds a header's values as one field, joined by NUL, which
// cannot occur in a header value, so the join is unambiguous.
func (f *Fingerprint) Values(values []string) {
	n := 0
	for i, v := range values {
		if i > 0 {
			n++
		}
		n += len(v)
	}
	f.buf = binary.BigEndian.AppendUint64(f.buf, uint64(n))
	for i, v := range values {
		if i > 0 {
			f.buf = append(f.buf, 0)
		}
		f.buf = append(f.buf, v...)
	}
}

// Bytes adds a field, hashed where it is rather than copied (a body).
func (f *Fingerprint) Bytes(b []byte) {
	f.buf = binary.BigEndian.AppendUint64(f.buf, uint64(len(b)))
	f.h.Write(f.buf)
	f.buf = f.buf[:0]
	f.h.Write(b)
}

// Sum returns the fingerprint of the fields added, in hex, and returns f
// to the pool: f must not be used after.
func (f *Fingerprint) Sum() string {
	f.h.Write(f.buf)
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], f.h.Sum(f.sum[:0]))
	if cap(f.buf) <= 4<<10 {
		fingerprints.Put(f)
	}
	return string(out[:])
}
