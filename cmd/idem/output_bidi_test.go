package main

import (
	"strings"
	"testing"
	"unicode"

	"github.com/idemkit/idem"
)

// An operation ID is shown by "idem ls" as it is, but for control
// characters; Unicode's bidirectional overrides and isolates (U+202A-202E,
// U+2066-2069) are format characters, not controls, and reorder what the
// terminal shows. Found by review: an ID the client accepts
// ("refund/\u202Edecnalab-ton" displays as "refund/not-balanced") reaches
// the operator's terminal with the override, so the ID read in "idem ls"
// is not the one to type into "idem show", and a row can pass for another.
func TestReviewLsDoesNotPassBidiOverridesToTheTerminal(t *testing.T) {
	t.Parallel()
	path, j := openTestJournal(t)
	put(t, j, op{id: "refund/\u202Edecnalab-ton", url: "https://api.example/\u2066pay\u2069"})
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	r := idemOn(t, path, "ls")
	requireOK(t, r)
	if i := strings.IndexFunc(r.stdout, func(c rune) bool {
		return (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069)
	}); i >= 0 {
		t.Fatalf("idem ls wrote a bidirectional override/isolate %U to the terminal: %q", []rune(r.stdout[i:])[0], r.stdout)
	}
}

// "idem show" prints the same fields, URL and note included, through the
// same clean: none of them reaches the terminal with a format character.
func TestShowDoesNotPassFormatCharactersToTheTerminal(t *testing.T) {
	t.Parallel()
	path, j := openTestJournal(t)
	put(t, j, op{key: "k-bidi", id: "refund/\u202Edecnalab-ton", url: "https://api.example/\u2066pay\u2069\u200F",
		path: []idem.State{idem.StatePending, idem.StateInFlight, idem.StateUnknown}, lastError: "lost \u202Danswer"})
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	r := idemOn(t, path, "show", "k-bidi")
	requireOK(t, r)
	if i := strings.IndexFunc(r.stdout, func(c rune) bool { return unicode.Is(unicode.Cf, c) }); i >= 0 {
		t.Fatalf("idem show wrote the format character %U to the terminal: %q", []rune(r.stdout[i:])[0], r.stdout)
	}
	if !strings.Contains(r.stdout, "refund/?decnalab-ton") {
		t.Fatalf("idem show does not show the ID with the override replaced: %q", r.stdout)
	}
}
