package wire

import (
	"crypto/sha256"
	"encoding/hex"
)

// KeyHash names a key in logs and telemetry without revealing it: the
// first 8 bytes of SHA-256(scope, 0x00, key), in hex. The server
// middleware's logs (key_hash) and the otel module's spans
// (idem.key.hash) both use it, so that a log line and a span of one
// request are found by the same value; the scope enters only through the
// hash, as it may be a credential.
func KeyHash(scope, key string) string {
	h := sha256.New()
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:8])
}
