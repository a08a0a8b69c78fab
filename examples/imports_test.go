// Package examples_test holds the rules every example follows. An example
// is what a user copies into a module of their own, so it may use idem's
// public packages only: nothing under examples/ imports
// github.com/idemkit/idem/internal/... (its own examples/internal/demo
// scaffolding is not idem's internal).
package examples_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const internalPrefix = "github.com/idemkit/idem/internal"

// internalImports returns, for every Go file under root (tests included),
// the imports of idem's internal packages, as "file: path".
func internalImports(root string) (files int, found []string, err error) {
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		files++
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return err
			}
			if p == internalPrefix || strings.HasPrefix(p, internalPrefix+"/") {
				found = append(found, path+": "+p)
			}
		}
		return nil
	})
	return files, found, err
}

func TestExamplesImportNoInternalPackage(t *testing.T) {
	files, found, err := internalImports(".")
	require.NoError(t, err)
	// Every example and the server example's orders application are read.
	for _, f := range []string{"checkout/main.go", "resume/main.go", "agent/main.go", "batch/main.go", "server/main.go", "server/orders/orders.go"} {
		_, err := os.Stat(f)
		require.NoError(t, err, "the check must cover %s", f)
	}
	assert.Greater(t, files, 10)
	assert.Empty(t, found, "examples use idem's public API only; move what they need out of internal/")
}

// TestInternalImportsAreFound: the check itself finds an import of an
// internal package, in a test file too, and leaves look-alikes alone.
func TestInternalImportsAreFound(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(src), 0o600))
	}
	write("a/main.go", "package main\n\nimport (\n\t\"fmt\"\n\n\t\"github.com/idemkit/idem/examples/internal/demo\"\n\t\"github.com/idemkit/idem/internalize\"\n)\n")
	write("b/main_test.go", "package main\n\nimport w \"github.com/idemkit/idem/internal/wire\"\n")
	files, found, err := internalImports(dir)
	require.NoError(t, err)
	assert.Equal(t, 2, files)
	assert.Equal(t, []string{filepath.Join(dir, "b/main_test.go") + ": github.com/idemkit/idem/internal/wire"}, found)
}
