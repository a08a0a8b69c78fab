package webui

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/operator"
	"github.com/idemkit/idem/internal/uitest"
)

// bigJournal journals n operations (scope tenant-0..2 by i%3, ID
// "op-i", unknown when i%7 == 0, else pending) from several goroutines,
// and returns the journal and its keys in List's order.
func bigJournal(t *testing.T, n int) (*idem.SQLiteJournal, []string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ops.db")
	j, err := idem.OpenSQLite(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	const writers = 25
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := w; i < n; i += writers {
				rec := idem.Record{Key: uuid.NewString(), Scope: fmt.Sprintf("tenant-%d", i%3), ID: fmt.Sprintf("op-%d", i),
					Method: "POST", URL: "https://api.example.com/orders", Fingerprint: "f", KeyHeader: "Idempotency-Key",
					State: idem.StatePending}
				if i%7 == 0 {
					rec.State, rec.Attempts, rec.ExpiresAt = idem.StateInFlight, 1, time.Now().Add(time.Hour)
				}
				got, _, err := j.Create(context.Background(), rec)
				if err == nil && i%7 == 0 {
					got.State = idem.StateUnknown
					_, err = j.Update(context.Background(), got, idem.Durable, idem.Event{Kind: idem.EventAnswer})
				}
				if err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return j, listKeys(t, j, idem.Filter{})
}

func listKeys(t *testing.T, j idem.Journal, f idem.Filter) []string {
	t.Helper()
	var keys []string
	for rec, err := range j.List(context.Background(), f) {
		require.NoError(t, err)
		keys = append(keys, rec.Key)
	}
	return keys
}

var rowKey = regexp.MustCompile(`<tr data-key="([^"]+)">`)

// pageThrough follows the list's "next page" links from first and
// returns the keys of every row, in order, and the number of pages.
func pageThrough(t *testing.T, c *http.Client, base, first string) ([]string, int) {
	t.Helper()
	var keys []string
	pages := 0
	for u := first; u != ""; pages++ {
		require.Less(t, pages, 1000, "paging does not end")
		a := get(t, c, base+u)
		require.Equal(t, http.StatusOK, a.code, a.body)
		rows := rowKey.FindAllStringSubmatch(a.body, -1)
		require.LessOrEqual(t, len(rows), 100, "a page holds at most PageSize rows")
		for _, m := range rows {
			keys = append(keys, m[1])
		}
		u = ""
		if m := regexp.MustCompile(`<a href="([^"]+)" id="next">`).FindStringSubmatch(a.body); m != nil {
			u = htmlUnescape(m[1])
		}
	}
	return keys, pages
}

func htmlUnescape(s string) string {
	return regexp.MustCompile(`&amp;`).ReplaceAllString(s, "&")
}

// Paging 100 at a time through 2,500 operations visits each once, in
// the journal's order, with and without filters.
func TestPagingVisitsEachRecordOnceInOrder(t *testing.T) {
	t.Parallel()
	j, all := bigJournal(t, 2500)
	require.Len(t, all, 2500)
	srv, c := server(t, Config{Journal: j, PageSize: 100})

	keys, pages := pageThrough(t, c, srv.URL, "/ops")
	assert.Equal(t, all, keys, "every operation once, in order")
	assert.Equal(t, 25, pages)

	want := listKeys(t, j, idem.Filter{Scope: "tenant-1", States: []idem.State{idem.StateUnknown}})
	keys, _ = pageThrough(t, c, srv.URL, "/ops?scope=tenant-1&state=unknown")
	assert.Equal(t, want, keys, "one scope's unknown operations")
	require.NotEmpty(t, want)

	// The text filter is applied as the records stream by: "op-1" matches
	// op-1, op-10..op-19, op-100..op-199, op-1000..op-1999: 1,111.
	keys, pages = pageThrough(t, c, srv.URL, "/ops?q=OP-1")
	assert.Len(t, keys, 1111)
	assert.Equal(t, 12, pages)
	for _, k := range keys[:5] {
		rec := stateOf(t, j, k)
		assert.Regexp(t, `^op-1`, rec.ID)
	}
}

// The list filters by state, scope, age and text, and says what it
// cannot parse.
func TestListFilters(t *testing.T) {
	t.Parallel()
	path, keys := fixtureJournal(t)
	j := openJournal(t, path)
	srv, c := server(t, Config{Journal: j})
	shown := func(q string) []string {
		a := get(t, c, srv.URL+"/ops?"+q)
		require.Equal(t, http.StatusOK, a.code, "%s: %s", q, a.body)
		var got []string
		for _, m := range rowKey.FindAllStringSubmatch(a.body, -1) {
			got = append(got, m[1])
		}
		return got
	}
	assert.ElementsMatch(t, []string{keys[uitest.Unknown], keys[uitest.Unknown2]}, shown("state=unknown"))
	assert.ElementsMatch(t, []string{keys[uitest.Unknown], keys[uitest.Unknown2], keys[uitest.InFlight]},
		shown("state=unknown&state=in_flight"))
	assert.Equal(t, []string{keys[uitest.HostileMarkup]}, shown("scope="+url.QueryEscape(uitest.MarkupScope)))
	assert.Equal(t, []string{keys[uitest.Unknown], keys[uitest.Unknown2]}, shown("q=pay%2Finvoice"))
	assert.Equal(t, []string{keys[uitest.Unknown2]}, shown("q=invoice-8&state=unknown&scope=default"))
	assert.Len(t, shown(""), len(keys))
	assert.Empty(t, shown("older=1h"), "the fixture is seconds old")
	assert.Len(t, shown("older=0s"), len(keys))
	// The filter's form keeps what was asked.
	a := get(t, c, srv.URL+"/ops?state=unknown&q=pay")
	assert.Contains(t, a.body, `value="unknown" checked`)
	assert.Contains(t, a.body, `name="q" id="q" value="pay"`)

	for q, want := range map[string]string{
		"state=nope":      `unknown state &#34;nope&#34;`,
		"older=yesterday": "older than: bad duration",
		"after=" + url.QueryEscape(uuid.NewString()): "list again from the start",
	} {
		a := get(t, c, srv.URL+"/ops?"+q)
		assert.GreaterOrEqual(t, a.code, 400, q)
		assert.Contains(t, a.body, want, q)
	}
}

// The overview counts by state and scope and names the oldest unsettled
// operation.
func TestOverview(t *testing.T) {
	t.Parallel()
	path, keys := fixtureJournal(t)
	j := openJournal(t, path)
	srv, c := server(t, Config{Journal: j, Path: path})
	a := get(t, c, srv.URL+"/")
	require.Equal(t, http.StatusOK, a.code)
	counts, err := j.Count(context.Background())
	require.NoError(t, err)
	st, err := operator.NewStats(path, counts, time.Now())
	require.NoError(t, err)
	assert.Contains(t, a.body, fmt.Sprintf(`<div class="num" id="total">%d</div>`, st.Total))
	assert.Contains(t, a.body, `<div class="num" id="count-unknown">2</div>`)
	assert.Contains(t, a.body, `<div class="num" id="count-pending">3</div>`)
	assert.Contains(t, a.body, `<a href="/op?key=`+keys[uitest.Unknown]+`">pay/invoice-7</a>`, "the oldest unsettled")
	assert.Contains(t, a.body, `<a href="/ops?scope=tenant%22%3e%3cb%20id%3dpwned3%3e">tenant&#34;&gt;&lt;b id=pwned3&gt;</a>`)
}
