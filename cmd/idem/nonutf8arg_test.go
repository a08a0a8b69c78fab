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

// A flag's value that is not printable text (not UTF-8, or a control
// character) is a usage error on either kind of journal, said in the
// command's words, never the server's encoding error; and an empty
// --password-env, like an empty --schema, is one too.
func TestNonUTF8FlagValue(t *testing.T) {
	t.Parallel()
	schema, _ := standardPGJournal(t)
	path, _ := standardJournal(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ls", "--scope", "\xff"}, `ls: invalid value "\xff" for flag -scope: is not printable text`},
		{[]string{"ls", "--owner", "pod-1\xff"}, `ls: invalid value "pod-1\xff" for flag -owner: is not printable text`},
		{[]string{"ls", "--scope", "a\tb"}, `ls: invalid value "a\tb" for flag -scope: is not printable text`},
	} {
		requireOneLineError(t, idemOnPG(t, schema, c.args...), exitUsage, c.want)
		requireOneLineError(t, idemOn(t, path, c.args...), exitUsage, c.want)
	}
	r := cli(t, "", nil, "--journal", dsnWithPassword(t), "--schema", "idem\xff", "ls")
	requireNoPassword(t, r, nil)
	requireOneLineError(t, r, exitUsage, `--schema "idem\xff" is not printable text; name a schema, such as "idem"`)
	r = cli(t, "", nil, "--journal", dsnWithPassword(t), "--schema", schema, "--password-env", "", "ls")
	requireOneLineError(t, r, exitUsage, "--password-env is empty; name the environment variable that holds the password")
}
