package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/sqlitefile"
)

// Every bad input gets one line on stderr and its exit status, and
// changes nothing in the journal.
func TestBadInputsChangeNothing(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)
	before := takeSnapshot(t, path)
	const api = "http://127.0.0.1:1"
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no command", nil, 2, "no command given"},
		{"unknown command", []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"unknown global flag", []string{"--verbose", "ls"}, 2, "flag provided but not defined: -verbose"},
		{"unknown flag", []string{"ls", "--bogus"}, 2, "ls: flag provided but not defined: -bogus"},
		{"flag without value", []string{"ls", "--state"}, 2, "flag needs an argument: -state"},
		{"extra argument", []string{"ls", "extra"}, 2, `ls: unexpected argument "extra"`},
		{"unknown state", []string{"ls", "--state", "bogus"}, 2, `unknown state "bogus"`},
		{"one unknown state among several", []string{"ls", "--state", "pending,done"}, 2, `unknown state "done"`},
		{"empty state", []string{"ls", "--state", "pending,"}, 2, "empty state name"},
		{"bad duration", []string{"ls", "--older-than", "7x"}, 2, `bad duration "7x"`},
		{"bad days", []string{"ls", "--older-than", "xd"}, 2, `bad duration "xd"`},
		{"negative duration", []string{"prune", "--older-than", "-1h"}, 2, "negative"},
		{"prune without --older-than", []string{"prune", "--dry-run"}, 2, "--older-than is required"},
		{"show without argument", []string{"show"}, 2, "show: missing KEY or SCOPE/ID"},
		{"show two arguments", []string{"show", "a", "b"}, 2, `unexpected argument "b"`},
		{"show unknown key", []string{"show", "no-such-key"}, 1, `no operation has key "no-such-key"`},
		{"show unknown scope/ID", []string{"show", "default/no/such"}, 1, `nor ID "no/such" in scope "default"`},
		{"reconcile without --note", []string{"reconcile", recs[rUnknown].Key, "--as", "succeeded"}, 2, "--note is required"},
		{"reconcile with a blank note", []string{"reconcile", recs[rUnknown].Key, "--as", "succeeded", "--note", "  "}, 2, "--note is required"},
		{"reconcile without --as", []string{"reconcile", recs[rUnknown].Key, "--note", "x"}, 2, "--as succeeded|rejected is required"},
		{"reconcile as pending", []string{"reconcile", recs[rUnknown].Key, "--as", "pending", "--note", "x"}, 2, "reconciled as succeeded or rejected"},
		{"reconcile unknown key", []string{"reconcile", "no-such-key", "--as", "succeeded", "--note", "x"}, 1, `no operation has key "no-such-key"`},
		{"reconcile a succeeded operation", []string{"reconcile", recs[rSucceeded].Key, "--as", "rejected", "--note", "x"}, 1, "illegal state transition"},
		{"reconcile a pending operation", []string{"reconcile", recs[rPending].Key, "--as", "succeeded", "--note", "x"}, 1, "only unknown or expired operations are reconciled"},
		{"reconcile a canceled operation", []string{"reconcile", recs[rCanceled].Key, "--as", "succeeded", "--note", "x"}, 1, "illegal state transition"},
		{"cancel without argument", []string{"cancel"}, 2, "cancel: missing KEY or SCOPE/ID"},
		{"cancel unknown key", []string{"cancel", "no-such-key"}, 1, `no operation has key "no-such-key"`},
		{"cancel an in-flight operation", []string{"cancel", recs[rInFlight].Key}, 1, "is in_flight; only a pending operation that was never sent can be canceled"},
		{"cancel an unknown operation", []string{"cancel", recs[rUnknown].Key}, 1, "is unknown; only a pending operation"},
		{"cancel a succeeded operation", []string{"cancel", recs[rSucceeded].Key}, 1, "is succeeded; only a pending operation"},
		{"resume without --base-url", []string{"resume", "--replay"}, 2, "--base-url is required"},
		{"resume without status", []string{"resume", "--base-url", api}, 2, "--status-url URL or --replay is required"},
		{"resume with both", []string{"resume", "--base-url", api, "--replay", "--status-url", api}, 2, "not both"},
		{"resume with a bad URL", []string{"resume", "--base-url", "ftp://host", "--replay"}, 2, "must be an absolute http or https URL"},
		{"resume with a relative URL", []string{"resume", "--base-url", "/api", "--replay"}, 2, "must be an absolute http or https URL"},
		{"resume with a credential in the URL", []string{"resume", "--base-url", "http://user:pw@127.0.0.1:1", "--replay"}, 2, "must not carry credentials"},
		{"resume with a bad --header-env", []string{"resume", "--base-url", api, "--replay", "--header-env", "Authorization"}, 2, "want NAME=ENV"},
		{"resume with a bad header name", []string{"resume", "--base-url", api, "--replay", "--header-env", "Bad Header=X"}, 2, "not a valid header name"},
		{"resume with an unset variable", []string{"resume", "--base-url", api, "--replay", "--header-env", "Authorization=IDEM_TEST_SURELY_UNSET"}, 1, "environment variable IDEM_TEST_SURELY_UNSET is unset or empty"},
		{"resume with no workers", []string{"resume", "--base-url", api, "--replay", "--concurrency", "0"}, 2, "--concurrency must be at least 1"},
		{"resume with a bad timeout", []string{"resume", "--base-url", api, "--replay", "--timeout", "soon"}, 2, `bad duration "soon"`},
		{"resume with --scope and --all-scopes", []string{"resume", "--base-url", api, "--replay", "--scope", "a", "--all-scopes"}, 2, "give --scope or --all-scopes, not both"},
		{"resume with an empty scope", []string{"resume", "--base-url", api, "--replay", "--scope", ""}, 2, "empty scope name"},
		{"resume with a scope twice", []string{"resume", "--base-url", api, "--replay", "--scope", "a", "--scope", "a"}, 2, `scope "a" is given twice`},
		{"resume with a control character in a scope", []string{"resume", "--base-url", api, "--replay", "--scope", "a\x1b"}, 2, "is not printable text"},
		{"help for an unknown command", []string{"help", "frobnicate"}, 2, `unknown command "frobnicate"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := cli(t, "", []string{"IDEM_JOURNAL=" + path}, tc.args...)
			requireOneLineError(t, r, tc.code, tc.want)
			assert.Equal(t, before, takeSnapshot(t, path))
		})
	}
}

// A journal path that is not a journal is refused by every command, and
// the file is left exactly as it was; a missing one is not created.
func TestBadJournalFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	text := filepath.Join(dir, "notes.txt")
	require.NoError(t, os.WriteFile(text, []byte("not a database\n"), 0o600))
	empty := filepath.Join(dir, "empty.db")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	foreign := filepath.Join(dir, "foreign.db")
	db, err := sqlitefile.Open(context.Background(), foreign, sqlitefile.Options{What: "other", AppID: 0x0bad0bad,
		Migrations: []string{"CREATE TABLE accounts (id INTEGER PRIMARY KEY, name TEXT)"}})
	require.NoError(t, err)
	require.NoError(t, db.Close())
	missing := filepath.Join(dir, "missing.db")
	missingDir := filepath.Join(dir, "no-such-dir", "ops.db")

	commands := [][]string{
		{"ls"}, {"ls", "--json"}, {"show", "k"}, {"stats"}, {"prune", "--older-than", "1d"},
		{"prune", "--older-than", "1d", "--dry-run"}, {"reconcile", "k", "--as", "succeeded", "--note", "n"},
		{"cancel", "k"}, {"resume", "--base-url", "http://127.0.0.1:1", "--replay"},
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing file", missing, "file does not exist"},
		{"missing directory", missingDir, "file does not exist"},
		{"directory", dir, "is a directory"},
		{"text file", text, "not an idem journal"},
		{"empty file", empty, "not an idem journal: the file is empty"},
		{"another program's database", foreign, "not an idem journal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := dirContents(t, dir)
			for _, args := range commands {
				r := idemOn(t, tc.path, args...)
				requireOneLineError(t, r, 1, tc.want)
				assert.Contains(t, r.stderr, tc.path)
				assert.Equal(t, files, dirContents(t, dir), "idem %v changed the files", args)
			}
		})
	}
	_, err = os.Stat(missing)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// dirContents maps every file under dir to its content.
func dirContents(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		out[p] = string(b)
		return err
	}))
	return out
}

func TestJournalLocation(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)
	n := len(recs)

	// --journal before or after the command.
	for _, args := range [][]string{
		{"--journal", path, "ls", "--json"},
		{"ls", "--json", "--journal", path},
		{"--journal=" + path, "ls", "--json"},
		{"ls", "--journal=" + path, "--json"},
	} {
		r := cli(t, "", nil, args...)
		requireOK(t, r)
		assert.Len(t, jsonLines(t, r.stdout), n, "%v", args)
	}

	// $IDEM_JOURNAL, which --journal overrides.
	r := cli(t, "", []string{"IDEM_JOURNAL=" + path}, "ls", "--json")
	requireOK(t, r)
	assert.Len(t, jsonLines(t, r.stdout), n)
	r = cli(t, "", []string{"IDEM_JOURNAL=" + filepath.Join(t.TempDir(), "other.db")}, "--journal", path, "ls", "--json")
	requireOK(t, r)
	assert.Len(t, jsonLines(t, r.stdout), n)

	// Else ./idem.db, which is not created when missing.
	work := t.TempDir()
	r = cli(t, work, nil, "ls")
	requireOneLineError(t, r, 1, filepath.Join(work, "idem.db"))
	assert.Empty(t, dirContents(t, work))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(work, "idem.db"), b, 0o600))
	r = cli(t, work, nil, "stats", "--json")
	requireOK(t, r)
	assert.Contains(t, r.stdout, `"total":8`)
}

func TestHelp(t *testing.T) {
	t.Parallel()
	r := cli(t, "", nil, "help")
	requireOK(t, r)
	for _, c := range commands {
		assert.Contains(t, r.stdout, "\n  "+c.name+" ")
		assert.Contains(t, r.stdout, "Usage: idem "+c.name+" "+c.args+"\n")
	}
	for _, flag := range []string{"--journal PATH", "--state STATES", "--older-than D", "--body", "--as OUTCOME",
		"--note TEXT", "--header-env NAME=ENV", "--status-url URL", "--replay", "--dry-run", "--concurrency N", "--timeout D",
		"--scope SCOPE", "--all-scopes", "--wait", "--schema SCHEMA", "--password-env NAME", "--owner OWNER"} {
		assert.Contains(t, r.stdout, "  "+flag)
	}
	assert.Contains(t, r.stdout, "Exit status")

	for _, args := range [][]string{{"-h"}, {"--help"}, {"help", "help"}} {
		r = cli(t, "", nil, args...)
		requireOK(t, r)
		assert.True(t, strings.HasPrefix(r.stdout, "Usage: idem [--journal PATH|URL] [--schema NAME] [--password-env NAME] COMMAND"), "%v: %s", args, r.stdout)
	}
	for _, args := range [][]string{{"help", "prune"}, {"prune", "-h"}, {"prune", "--help"}, {"--journal", "x.db", "prune", "-h"}} {
		r = cli(t, "", nil, args...)
		requireOK(t, r)
		assert.True(t, strings.HasPrefix(r.stdout, "Usage: idem prune --older-than D [--dry-run]\n"), "%v: %s", args, r.stdout)
		assert.Contains(t, r.stdout, "  --dry-run\n")
		assert.NotContains(t, r.stdout, "--state")
	}
}

// run is also callable in-process, with its environment injected.
func TestRunInProcess(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)
	var stdout, stderr bytes.Buffer
	getenv := func(name string) string {
		if name == "IDEM_JOURNAL" {
			return path
		}
		return ""
	}
	code := run([]string{"show", "default/checkout/cart-42", "--json"}, &stdout, &stderr, getenv)
	require.Equal(t, 0, code, stderr.String())
	assert.Contains(t, stdout.String(), `"key":"`+recs[rPending].Key+`"`)
	assert.Empty(t, stderr.String())

	stdout.Reset()
	code = run([]string{"ls", "--state", "nope"}, &stdout, &stderr, getenv)
	assert.Equal(t, 2, code)
	assert.Equal(t, "idem: ls: invalid value \"nope\" for flag -state: unknown state \"nope\" (want one of pending, in_flight, unknown, succeeded, rejected, expired, canceled) (see 'idem help ls')\n", stderr.String())
	assert.Empty(t, stdout.String())
}
