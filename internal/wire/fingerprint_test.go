package wire_test

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem/internal/wire"
)

// refFingerprint is the formula written out: each field's 8-byte
// big-endian length, then its bytes, all hashed with SHA-256.
func refFingerprint(fields ...string) string {
	var b []byte
	for _, f := range fields {
		b = binary.BigEndian.AppendUint64(b, uint64(len(f)))
		b = append(b, f...)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func TestFingerprintIsTheLengthPrefixedFields(t *testing.T) {
	body := strings.Repeat("b", 5000) // past the pooled buffer's bound
	// Three times: a Fingerprint from the pool starts empty again.
	for range 3 {
		f := wire.NewFingerprint()
		f.String("POST")
		f.String("")
		f.Values([]string{"a", "", "c"})
		f.Values(nil)
		f.Bytes([]byte(body))
		f.String("after the body")
		assert.Equal(t, refFingerprint("POST", "", "a\x00\x00c", "", body, "after the body"), f.Sum())
	}
	// Where one field ends and the next begins is part of what is hashed.
	one, two := wire.NewFingerprint(), wire.NewFingerprint()
	one.String("ab")
	one.String("c")
	two.String("a")
	two.String("bc")
	assert.NotEqual(t, one.Sum(), two.Sum())
}
