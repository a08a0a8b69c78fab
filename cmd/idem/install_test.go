package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// installProofEnv runs TestGoInstallFromAModuleProxy: it downloads the
// third-party modules from the machine's GOPROXY into an empty module
// cache and, the first time on a machine, compiles them.
const installProofEnv = "IDEM_INSTALL_PROOF"

// installVersion is the version the test releases the working tree as.
const installVersion = "v0.1.0"

// `go install github.com/idemkit/idem/cmd/idem@latest` gives one idem that
// opens both kinds of journal, and a program importing only the root
// module downloads no PostgreSQL driver: proven on the working tree laid
// out as a module proxy by scripts/release (the root, postgres and
// cmd/idem modules at installVersion), GitHub never asked. It takes a
// minute or two (the module downloads); .ci/run runs it.
func TestGoInstallFromAModuleProxy(t *testing.T) {
	if os.Getenv(installProofEnv) == "" {
		t.Skipf("set %s=1 to release the working tree into a module proxy and go install the command from it", installProofEnv)
	}
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	upstream := goOutput(t, "", nil, "env", "GOPROXY")

	// The paths stay the same from one run to the next: the build cache
	// keys compiled packages by their directory, and go-sqlite3's C would
	// be compiled again (minutes) in a module cache of a new name.
	base := filepath.Join(os.TempDir(), "idem-install-proof")
	require.NoError(t, os.RemoveAll(base))
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	proxy := filepath.Join(base, "proxy")
	goOutput(t, filepath.Join(repo, "scripts", "release"), nil,
		"run", ".", "-repo", repo, "-version", installVersion, "-proxy", proxy, ".", "postgres", "cmd/idem")

	// An empty GOPATH and module cache (a new user's), the build cache shared.
	gopath := filepath.Join(base, "gopath")
	env := []string{
		"GOPATH=" + gopath,
		"GOMODCACHE=" + filepath.Join(gopath, "pkg", "mod"),
		"GOBIN=" + filepath.Join(base, "bin"),
		"GOPROXY=file://" + proxy + "," + upstream,
		"GONOSUMDB=github.com/idemkit/*",
		"GOFLAGS=-mod=mod -modcacherw", // -modcacherw: RemoveAll can delete the cache
		"GOWORK=off",
		"GOTOOLCHAIN=local",
		// The go command indexes a module cache's packages once per
		// path@version (in the build cache, which outlives base): the
		// working tree released again as the same version at the same
		// path would be read with the imports of an earlier run's files
		// ("could not import maps (open : no such file or directory)").
		"GODEBUG=goindex=0",
	}

	// A program importing only the root module, first, while the cache is
	// empty: what it downloads is what it needs.
	consumer := filepath.Join(base, "consumer")
	require.NoError(t, os.MkdirAll(consumer, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(consumer, "go.mod"),
		[]byte("module example.com/consumer\n\ngo 1.26\n\nrequire github.com/idemkit/idem "+installVersion+"\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(consumer, "main.go"), []byte(`package main

import "github.com/idemkit/idem"

func main() {
	j, err := idem.OpenSQLite("ops.db")
	if err == nil {
		j.Close()
	}
}
`), 0o644))
	goOutput(t, consumer, env, "mod", "tidy")
	goOutput(t, consumer, env, "build", "-o", os.DevNull, ".")
	mods := goOutput(t, consumer, env, "list", "-m", "all")
	assert.Contains(t, mods, "github.com/idemkit/idem "+installVersion+"\n")
	assert.NotContains(t, mods, "github.com/jackc/")
	assert.NotContains(t, mods, "github.com/idemkit/idem/postgres")
	downloaded := goOutput(t, consumer, env, "mod", "download", "-json", "all")
	dec := json.NewDecoder(strings.NewReader(downloaded))
	var paths []string
	for {
		var m struct{ Path, Version, Error string }
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		require.Empty(t, m.Error, "go mod download %s@%s", m.Path, m.Version)
		paths = append(paths, m.Path)
	}
	assert.Contains(t, paths, "github.com/idemkit/idem")
	assert.Contains(t, paths, "github.com/mattn/go-sqlite3")
	for _, p := range paths {
		assert.False(t, strings.HasPrefix(p, "github.com/jackc/"), "the consumer downloaded %s", p)
	}
	assert.NoDirExists(t, filepath.Join(gopath, "pkg", "mod", "cache", "download", "github.com", "jackc"),
		"a PostgreSQL driver is in the module cache of a program that imports only the root module")

	// The command, as the README says to install it, from outside any module.
	goOutput(t, base, env, "install", "github.com/idemkit/idem/cmd/idem@latest")
	bin := filepath.Join(base, "bin", "idem")
	info := goOutput(t, "", nil, "version", "-m", bin)
	assert.Regexp(t, `(?m)^\s+mod\s+github.com/idemkit/idem/cmd/idem\s+`+installVersion+`\s`, info)
	assert.Regexp(t, `(?m)^\s+dep\s+github.com/idemkit/idem\s+`+installVersion+`\s`, info)
	assert.Regexp(t, `(?m)^\s+dep\s+github.com/idemkit/idem/postgres\s+`+installVersion+`\s`, info)
	assert.Regexp(t, `(?m)^\s+dep\s+github.com/jackc/pgx/v5\s`, info)

	r := runBinary(t, bin, "", nil, "--help")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "PostgreSQL")

	// Both kinds of journal open.
	path, _ := standardJournal(t)
	r = runBinary(t, bin, "", nil, "--journal", path, "ls", "--json")
	requireOK(t, r)
	assert.Len(t, jsonLines(t, r.stdout), 8)
	schema, _ := standardPGJournal(t) // skips when PostgreSQL cannot be reached
	r = runBinary(t, bin, "", nil, "--journal", dsnWithPassword(t), "--schema", schema, "ls", "--json")
	requireOK(t, r)
	requireNoPassword(t, r, []string{"ls"})
	assert.Len(t, jsonLines(t, r.stdout), 8)
}

// goOutput runs the go command in dir (the test's own when empty) with
// env added to the test's environment, and returns its standard output.
func goOutput(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("go %s (%s): %s", strings.Join(args, " "), time.Since(start).Round(time.Second), strings.TrimSpace(stderr.String()))
	require.NoError(t, err, "go %s in %s:\n%s", strings.Join(args, " "), dir, stderr.String())
	return stdout.String()
}
