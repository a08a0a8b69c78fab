package idem_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The README backs its promises and its bad-input catalogue with test
// names: each must be a test of this repository, so that a renamed or
// deleted test cannot leave a promise unbacked.
func TestReadmeNamesOnlyTestsThatExist(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	defined := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllSubmatch(b, -1) {
			defined[string(m[1])] = true
		}
		return nil
	})
	require.NoError(t, err)
	named := regexp.MustCompile("`(Test[A-Za-z0-9_]+)`").FindAllSubmatch(readme, -1)
	require.NotEmpty(t, named)
	for _, m := range named {
		assert.True(t, defined[string(m[1])], "README.md names %s, which is no test of this repository", m[1])
	}
}

// The README's first command is the checkout demo: it names each of the
// demo's flags, so that a flag added to the demo is not one nobody hears
// of.
func TestReadmeNamesTheDemosFlags(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	src, err := os.ReadFile(filepath.Join("examples", "checkout", "main.go"))
	require.NoError(t, err)
	flags := regexp.MustCompile(`flag\.[A-Za-z]+\("([a-z-]+)"`).FindAllSubmatch(src, -1)
	require.NotEmpty(t, flags, "the demo's flags are no longer declared with package flag: update this test")
	for _, f := range flags {
		assert.Contains(t, string(readme), "go run ./examples/checkout -"+string(f[1]), "README.md does not show the demo's -%s flag", f[1])
	}
}

// The README names methods of State (rec.State.Terminal()): each must be
// one, so that a reader who copies the call gets code that compiles.
func TestReadmeNamesOnlyStateMethodsThatExist(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	src, err := os.ReadFile(filepath.Join("journal", "state.go"))
	require.NoError(t, err)
	methods := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^func \(s State\) ([A-Z][A-Za-z0-9]*)\(`).FindAllSubmatch(src, -1) {
		methods[string(m[1])] = true
	}
	require.True(t, methods["Terminal"], "journal/state.go no longer declares State's methods as this test reads them")
	named := regexp.MustCompile(`State\.([A-Z][A-Za-z0-9]*)\(\)`).FindAllSubmatch(readme, -1)
	require.NotEmpty(t, named, "the README names no method of State: say which one tells a settled operation")
	for _, m := range named {
		assert.True(t, methods[string(m[1])], "README.md names State.%s(), which State does not have", m[1])
	}
}
