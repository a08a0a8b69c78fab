package wire_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/wire"
)

// "fingerprint" is optional; present, it must have the form of one, or the
// answer is a bad status (never a silent mismatch, never ignored).
func TestDecodeStatusFingerprint(t *testing.T) {
	fp := wire.RequestFingerprint("POST", "/orders", []byte("{}"))
	completed := func(f string) string {
		return `{"key":"k","state":"completed","fingerprint":"` + f + `","response":{"status":201,"body":"{}"}}`
	}
	s, _, err := wire.DecodeStatus(http.StatusOK, []byte(completed(fp)), "k")
	require.NoError(t, err)
	assert.Equal(t, fp, s.Fingerprint)

	s, _, err = wire.DecodeStatus(http.StatusOK, []byte(`{"key":"k","state":"completed","response":{"status":201,"body":"{}"}}`), "k")
	require.NoError(t, err, "an answer without it, as servers before it send")
	assert.Empty(t, s.Fingerprint)

	for _, bad := range []string{"fp1", strings.ToUpper(fp), fp[:63], fp + "0", strings.Repeat("g", 64)} {
		_, _, err = wire.DecodeStatus(http.StatusOK, []byte(completed(bad)), "k")
		assert.ErrorIs(t, err, wire.ErrBadStatus, "%q", bad)
	}
}
