package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A release written back into the working tree (-write) is the commit to
// tag: its go.sum files carry the hashes of the modules as laid out from
// the working tree, which the proxies will compute from the tag. A file
// git would add but has not committed, or a change not committed, would
// be in the one and not the other, and `go install …@VERSION` would then
// fail its checksum; so -write refuses such a tree, and writes nothing.
func TestWriteRefusesAnUncommittedTree(t *testing.T) {
	for _, c := range []struct {
		name  string
		dirty func(t *testing.T, repo string)
	}{
		{"untracked file", func(t *testing.T, repo string) { writeFile(t, filepath.Join(repo, "extra.go"), "package idem\n") }},
		{"modified file", func(t *testing.T, repo string) {
			writeFile(t, filepath.Join(repo, "idem.go"), "package idem\n\n// changed\n")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			repo := t.TempDir()
			writeFile(t, filepath.Join(repo, "go.mod"), "module github.com/idemkit/idem\n\ngo 1.26\n")
			writeFile(t, filepath.Join(repo, "idem.go"), "package idem\n")
			git(t, repo, "init", "-q")
			git(t, repo, "add", ".")
			git(t, repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "init")
			c.dirty(t, repo)

			proxy := filepath.Join(t.TempDir(), "proxy")
			err := run([]string{"-repo", repo, "-version", "v0.1.0", "-proxy", proxy, "-write", "."})
			if err == nil || !strings.Contains(err.Error(), "not committed") {
				t.Fatalf("release -write of a tree with an %s: err = %v, want one saying what is not committed", c.name, err)
			}
			if _, err := os.Stat(proxy); !os.IsNotExist(err) {
				t.Errorf("the refused release made its proxy directory (%v)", err)
			}
			if out := git(t, repo, "status", "--porcelain", "--", "go.mod", "go.sum"); out != "" {
				t.Errorf("the refused release wrote into the working tree:\n%s", out)
			}

			// Without -write, the working tree as it is: what the install
			// proof tests before anything is committed.
			if err := run([]string{"-repo", repo, "-version", "v0.1.0", "-proxy", proxy, "."}); err != nil {
				t.Fatalf("release without -write: %v", err)
			}
		})
	}
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
