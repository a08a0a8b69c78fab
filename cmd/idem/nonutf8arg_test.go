package main

import (
	"testing"
)

// An argument that is not UTF-8 text names no operation: show, reconcile
// and cancel say so in the words they use on SQLite, not with the
// server's encoding error.
func TestNonUTF8ArgumentNamesNoOperation(t *testing.T) {
	t.Parallel()
	schema, _ := standardPGJournal(t)
	for _, args := range [][]string{
		{"show", "\xff"},
		{"show", "default/\xff"},
		{"cancel", "\xfe\xff"},
		{"reconcile", "default/\xff", "--as", "succeeded", "--note", "n"},
	} {
		r := idemOnPG(t, schema, args...)
		requireOneLineError(t, r, exitError, "no operation has key")
	}
}
