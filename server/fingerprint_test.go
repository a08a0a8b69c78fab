package server

import "testing"

// Stored fingerprints must keep their meaning across versions: a change of
// the formula would answer every retry of a stored key with 422. The value
// is what the formula of the first release computes.
func TestFingerprintIsStable(t *testing.T) {
	const want = "748b95a872a0da69edb9b3ddba6a0be89ccddbf374ebfb3d28f397a27c91f21f"
	if got := fingerprint("POST", "/orders?x=1", []byte(`{"a":1}`)); got != want {
		t.Errorf("fingerprint = %s, want %s", got, want)
	}
}
