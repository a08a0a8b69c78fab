package wire_test

import (
	"testing"

	"github.com/idemkit/idem/internal/wire"
)

// TestIsTokenEveryByte checks IsToken's table against the RFC's tchars,
// written out in fzIsToken, for every byte alone and inside a token.
func TestIsTokenEveryByte(t *testing.T) {
	for c := 0; c < 256; c++ {
		for _, s := range []string{string([]byte{byte(c)}), "X-" + string([]byte{byte(c)}) + "z"} {
			if got, want := wire.IsToken(s), fzIsToken(s); got != want {
				t.Errorf("IsToken(%q) = %v, want %v", s, got, want)
			}
		}
	}
	if wire.IsToken("") {
		t.Error(`IsToken("") = true`)
	}
}
