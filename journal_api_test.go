package idem_test

import (
	"errors"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/journal"
)

// journalRules are the functions only a journal's author needs: they live
// in package journal, never beside Do in package idem's documentation.
var journalRules = []string{
	"NewRecord", "ApplyUpdate", "ApplyClaim", "ApplyRenew", "ApplyRelease",
	"Claimable", "Prunable", "CloneRecord", "SortCounts",
	"CheckDurability", "CheckClaimRequest", "NotFound", "FingerprintMismatch", "TruncateTime",
}

// sharedNames are declared in package journal and kept under the same name
// in package idem, as aliases, re-declared constants and the same errors.
var sharedNames = []string{
	"Record", "Lease", "Response", "Event", "EventKind", "Filter", "ClaimRequest", "Count",
	"Durability", "Durable", "Deferred", "Buffered",
	"State", "StatePending", "StateInFlight", "StateUnknown", "StateSucceeded", "StateRejected",
	"StateExpired", "StateCanceled", "ParseState", "States",
	"EventUpdate", "EventCreate", "EventSend", "EventAnswer", "EventStatus", "EventClaim",
	"EventStop", "EventExpire", "EventOperator",
	"DefaultMaxBodySize",
	"ErrNotFound", "ErrFingerprintMismatch", "ErrConflict", "ErrLeaseLost", "ErrLeased", "ErrNotActive",
	"ErrIllegalTransition", "ErrDuplicateKey", "ErrBodyTooLarge", "ErrInvalidRecord", "ErrJournalClosed",
}

// exported returns every name go doc lists for the package in dir:
// functions (those grouped under a type too), types, methods, constants and
// variables. It also returns the import paths of the package's files.
func exported(t *testing.T, dir, importPath string) (names map[string]bool, imports []string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.ParseComments)
		require.NoError(t, err)
		files = append(files, f)
		for _, im := range f.Imports {
			p, err := strconv.Unquote(im.Path.Value)
			require.NoError(t, err)
			imports = append(imports, p)
		}
	}
	require.NotEmpty(t, files, "no Go files in %s", dir)
	pkg, err := doc.NewFromFiles(fset, files, importPath)
	require.NoError(t, err)
	names = map[string]bool{}
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			for _, n := range v.Names {
				names[n] = true
			}
		}
	}
	funcs := func(fs []*doc.Func) {
		for _, f := range fs {
			names[f.Name] = true
		}
	}
	values(pkg.Consts)
	values(pkg.Vars)
	funcs(pkg.Funcs)
	for _, typ := range pkg.Types {
		names[typ.Name] = true
		values(typ.Consts)
		values(typ.Vars)
		funcs(typ.Funcs)
		for _, m := range typ.Methods {
			names[typ.Name+"."+m.Name] = true
		}
	}
	return names, imports
}

// The journal rules are package journal's API, not the client's: go doc
// github.com/idemkit/idem does not list them, go doc .../journal does, and
// package journal imports nothing of idem (but internal packages), so that
// idem's journals and journals in other modules share it without a cycle.
func TestJournalRulesLiveInPackageJournal(t *testing.T) {
	t.Parallel()
	root, _ := exported(t, ".", "github.com/idemkit/idem")
	leaf, imports := exported(t, "journal", "github.com/idemkit/idem/journal")

	for _, name := range journalRules {
		assert.False(t, root[name], "go doc github.com/idemkit/idem lists %s: a journal rule belongs to package journal", name)
		assert.True(t, leaf[name], "package journal does not declare %s", name)
	}
	for _, name := range sharedNames {
		assert.True(t, root[name], "package idem no longer declares %s: its users' code would break", name)
		assert.True(t, leaf[name], "package journal does not declare %s", name)
	}
	assert.True(t, root["Journal"], "the Journal interface stays in package idem")
	assert.False(t, leaf["Journal"], "the Journal interface stays in package idem")

	for _, p := range imports {
		if p == "github.com/idemkit/idem" || strings.HasPrefix(p, "github.com/idemkit/idem/") &&
			!strings.HasPrefix(p, "github.com/idemkit/idem/internal/") {
			t.Errorf("package journal imports %s: it must stay a leaf", p)
		}
	}
}

// Package idem's journal errors are package journal's values, so that
// errors.Is matches under either name, and its types are the same types.
func TestJournalNamesAreTheSameInBothPackages(t *testing.T) {
	t.Parallel()
	for _, pair := range [][2]error{
		{idem.ErrNotFound, journal.ErrNotFound},
		{idem.ErrFingerprintMismatch, journal.ErrFingerprintMismatch},
		{idem.ErrConflict, journal.ErrConflict},
		{idem.ErrLeaseLost, journal.ErrLeaseLost},
		{idem.ErrLeased, journal.ErrLeased},
		{idem.ErrNotActive, journal.ErrNotActive},
		{idem.ErrIllegalTransition, journal.ErrIllegalTransition},
		{idem.ErrDuplicateKey, journal.ErrDuplicateKey},
		{idem.ErrBodyTooLarge, journal.ErrBodyTooLarge},
		{idem.ErrInvalidRecord, journal.ErrInvalidRecord},
		{idem.ErrJournalClosed, journal.ErrJournalClosed},
	} {
		assert.Same(t, pair[1], pair[0], "idem's %v is not journal's", pair[0])
	}
	err := journal.NotFound("key k")
	assert.ErrorIs(t, err, idem.ErrNotFound)
	assert.True(t, errors.Is(journal.FingerprintMismatch(idem.Record{Scope: "s", ID: "i"}), idem.ErrFingerprintMismatch))

	// A value of either name is a value of the other: they are one type.
	var rec idem.Record = journal.Record{State: journal.StatePending}
	var s journal.State = rec.State
	assert.Equal(t, idem.StatePending, s)
	assert.Equal(t, journal.Buffered, idem.Buffered)
	assert.Equal(t, journal.EventOperator, idem.EventOperator)
	assert.Equal(t, journal.DefaultMaxBodySize, idem.DefaultMaxBodySize)
	assert.Equal(t, journal.States(), idem.States())
	got, err := idem.ParseState("in-flight")
	require.NoError(t, err)
	assert.Equal(t, journal.StateInFlight, got)
}
