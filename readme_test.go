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
