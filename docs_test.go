package idem_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goPackages returns the non-test Go files of every package of the
// repository (every module), parsed with their comments, by directory.
func goPackages(t *testing.T) map[string][]*ast.File {
	t.Helper()
	fset := token.NewFileSet()
	pkgs := map[string][]*ast.File{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != "." {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		pkgs[filepath.Dir(path)] = append(pkgs[filepath.Dir(path)], f)
		return nil
	})
	require.NoError(t, err)
	return pkgs
}

// What go doc shows of a package never sends its reader to a name it
// cannot see: an exported declaration's doc comment names no unexported
// identifier of its package that reads as one (camelCase, as
// "secondBatch"; plain words are left alone).
func TestExportedDocsNameNoUnexportedIdentifier(t *testing.T) {
	t.Parallel()
	camel := regexp.MustCompile(`^[a-z][a-z0-9]*[A-Z][A-Za-z0-9]*$`)
	word := regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)
	for dir, files := range goPackages(t) {
		if strings.Contains(dir, "internal") || files[0].Name.Name == "main" {
			continue // not a package anyone reads with go doc
		}
		hidden := map[string]bool{}
		for _, f := range files {
			for _, d := range f.Decls {
				for _, name := range declNames(d) {
					if !ast.IsExported(name) && camel.MatchString(name) {
						hidden[name] = true
					}
				}
			}
		}
		check := func(what string, doc *ast.CommentGroup) {
			if doc == nil {
				return
			}
			for _, w := range word.FindAllString(doc.Text(), -1) {
				assert.False(t, hidden[w], "%s: the doc of %s names %s, which go doc does not show", dir, what, w)
			}
		}
		for _, f := range files {
			check("package "+f.Name.Name, f.Doc)
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					if d.Name.IsExported() && (d.Recv == nil || exportedRecv(d.Recv)) {
						check(d.Name.Name, d.Doc)
					}
				case *ast.GenDecl:
					for _, s := range d.Specs {
						switch s := s.(type) {
						case *ast.TypeSpec:
							if !s.Name.IsExported() {
								continue
							}
							doc := s.Doc
							if doc == nil {
								doc = d.Doc
							}
							check(s.Name.Name, doc)
							if st, ok := s.Type.(*ast.StructType); ok {
								for _, fl := range st.Fields.List {
									if len(fl.Names) > 0 && fl.Names[0].IsExported() {
										check(s.Name.Name+"."+fl.Names[0].Name, fl.Doc)
									}
								}
							}
						case *ast.ValueSpec:
							if len(s.Names) > 0 && s.Names[0].IsExported() {
								doc := s.Doc
								if doc == nil {
									doc = d.Doc
								}
								check(s.Names[0].Name, doc)
							}
						}
					}
				}
			}
		}
	}
}

// declNames are the top-level names a declaration introduces.
func declNames(d ast.Decl) []string {
	var names []string
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Recv == nil {
			names = append(names, d.Name.Name)
		}
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				names = append(names, s.Name.Name)
			case *ast.ValueSpec:
				for _, n := range s.Names {
					names = append(names, n.Name)
				}
			}
		}
	}
	return names
}

// exportedRecv reports whether a method's receiver type is exported.
func exportedRecv(recv *ast.FieldList) bool {
	if len(recv.List) == 0 {
		return false
	}
	t := recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	id, ok := t.(*ast.Ident)
	return ok && id.IsExported()
}

// constructors are the exported functions of the repository's packages
// that return a type of their own package whose name ends in suffix
// (OpenSQLite's *SQLiteJournal, postgres.OpenStore's *Store), as a doc of
// package from names them: bare in its own package, qualified elsewhere.
func constructors(t *testing.T, suffix, from string) []string {
	t.Helper()
	var names []string
	for dir, files := range goPackages(t) {
		if strings.Contains(dir, "internal") || strings.HasPrefix(dir, "examples") || files[0].Name.Name == "main" {
			continue
		}
		for _, f := range files {
			for _, d := range f.Decls {
				fn, ok := d.(*ast.FuncDecl)
				if !ok || fn.Recv != nil || !fn.Name.IsExported() || fn.Type.Results == nil {
					continue
				}
				res := fn.Type.Results.List[0].Type
				if s, ok := res.(*ast.StarExpr); ok {
					res = s.X
				}
				id, ok := res.(*ast.Ident) // a type of the function's own package
				if !ok || !id.IsExported() || !strings.HasSuffix(id.Name, suffix) {
					continue
				}
				name := fn.Name.Name
				if f.Name.Name != from {
					name = f.Name.Name + "." + name
				}
				names = append(names, name)
			}
		}
	}
	require.NotEmpty(t, names)
	return names
}

// The docs that tell a user which journal or store to open name every one
// the repository has: a new one (another database's module) fails this
// test until it is added there.
func TestDocsNameEveryJournalAndStore(t *testing.T) {
	t.Parallel()
	pkgs := goPackages(t)

	var journalDoc string
	for _, f := range pkgs["."] {
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || ts.Name.Name != "Config" {
				return true
			}
			for _, fl := range ts.Type.(*ast.StructType).Fields.List {
				if len(fl.Names) > 0 && fl.Names[0].Name == "Journal" {
					journalDoc = fl.Doc.Text()
				}
			}
			return false
		})
	}
	require.NotEmpty(t, journalDoc, "idem.Config.Journal has no doc")
	for _, name := range constructors(t, "Journal", "idem") {
		assert.Contains(t, journalDoc, name, "idem.Config.Journal's doc does not name %s", name)
	}

	var stores string
	for _, f := range pkgs["server"] {
		if doc := f.Doc.Text(); strings.Contains(doc, "# Stores") {
			stores = doc[strings.Index(doc, "# Stores"):]
			if i := strings.Index(stores[1:], "\n# "); i >= 0 {
				stores = stores[:i+1]
			}
		}
	}
	require.NotEmpty(t, stores, "package server's doc has no Stores section")
	for _, name := range constructors(t, "Store", "server") {
		assert.Contains(t, stores, name, "package server's Stores section does not name %s", name)
	}
}
