package journaltest

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// page lists at most n records matching f after the record with key
// after: one page of a client that pages with Filter.After.
func page(t *testing.T, j idem.Journal, f idem.Filter, after string, n int) []string {
	t.Helper()
	f.After = after
	var keys []string
	for rec, err := range j.List(t.Context(), f) {
		require.NoError(t, err, "List %+v", f)
		keys = append(keys, rec.Key)
		if len(keys) == n {
			break
		}
	}
	return keys
}

// pageAll pages through f, n records at a time, each page starting after
// the last key of the one before, and returns every key in the order seen.
func pageAll(t *testing.T, j idem.Journal, f idem.Filter, n int) []string {
	t.Helper()
	var all []string
	after := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10_000, "paging %+v does not end", f)
		keys := page(t, j, f, after, n)
		all = append(all, keys...)
		if len(keys) < n {
			return all
		}
		after = keys[len(keys)-1]
	}
}

// testListAfter pages through a journal larger than a journal's own read
// page, with and without filters: every record is seen once, in List's
// order, whatever the page size.
func testListAfter(t *testing.T, j idem.Journal) {
	const n = 600
	var all, scopeA, pending []idem.Record
	for i := range n {
		scope := []string{"tenant-a", "tenant-b", "tenant-c"}[i%3]
		state := idem.StatePending
		if i%5 == 0 {
			state = idem.StateInFlight
		}
		rec := createIn(t, j, scope, state)
		all = append(all, rec)
		if scope == "tenant-a" {
			scopeA = append(scopeA, rec)
		}
		if state == idem.StatePending {
			pending = append(pending, rec)
		}
	}
	for _, size := range []int{1, 7, 100, 256, 257, n} {
		assert.Equal(t, keysOf(all...), pageAll(t, j, idem.Filter{}, size), "every record, %d a page", size)
	}
	assert.Equal(t, keysOf(scopeA...), pageAll(t, j, idem.Filter{Scope: "tenant-a"}, 100), "one scope, 100 a page")
	assert.Equal(t, keysOf(pending...), pageAll(t, j, idem.Filter{States: []idem.State{idem.StatePending}}, 100),
		"one state, 100 a page")

	// The cursor need not match the filter: a page of tenant-a after a
	// record of tenant-b starts at the next tenant-a record.
	assert.Equal(t, keysOf(scopeA[2:5]...), page(t, j, idem.Filter{Scope: "tenant-a"}, all[4].Key, 3))
	// After the last record there is nothing.
	assert.Empty(t, page(t, j, idem.Filter{}, all[n-1].Key, 10))
}

// testListAfterUnknown: a cursor that names no record is an error
// matching ErrNotFound, and nothing is listed.
func testListAfterUnknown(t *testing.T, j idem.Journal) {
	create(t, j, newRecord("tenant-a"))
	var recs []idem.Record
	var errs []error
	for rec, err := range j.List(t.Context(), idem.Filter{After: "00000000-0000-4000-8000-000000000000"}) {
		if err != nil {
			errs = append(errs, err)
			continue
		}
		recs = append(recs, rec)
	}
	assert.Empty(t, recs)
	require.Len(t, errs, 1)
	assert.True(t, errors.Is(errs[0], idem.ErrNotFound), "%v", errs[0])
	assert.Contains(t, errs[0].Error(), "list again from the start")
}
