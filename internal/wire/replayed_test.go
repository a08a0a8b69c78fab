package wire

import (
	"net/http"
	"testing"
)

// Replayed looks the replay headers up by their names as they are, which
// is what http.Header.Get does only for canonical names: a name added to
// ReplayHeaders in another spelling would never be found.
func TestReplayHeadersAreCanonical(t *testing.T) {
	for _, name := range ReplayHeaders {
		if c := http.CanonicalHeaderKey(name); c != name {
			t.Errorf("replay header %q is not canonical (%q)", name, c)
		}
	}
}

// Replayed reads what a server sets, in any case of name and value, as
// http.Header.Get would.
func TestReplayedReadsTheHeadersAsGetDoes(t *testing.T) {
	for _, name := range append(ReplayHeaders, "idempotent-replayed", "x-IDEMPOTENT-replayed") {
		for _, v := range []string{"true", " TRUE ", "false", ""} {
			h := http.Header{}
			h.Set(name, v)
			want := false
			for _, n := range ReplayHeaders {
				if v := h.Get(n); v == "true" || v == " TRUE " {
					want = true
				}
			}
			if got := Replayed(h); got != want {
				t.Errorf("Replayed(%q: %q) = %v, want %v", name, v, got, want)
			}
		}
	}
}
