package webui

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/uitest"
)

// The live parts are the pages' insides, read afresh on every fetch:
// what another process writes to the journal shows at the next fetch.
func TestLivePartsFollowTheJournal(t *testing.T) {
	t.Parallel()
	path, keys := fixtureJournal(t)
	// A stopped clock: the ages shown do not move between two fetches.
	now := time.Now()
	srv, c := server(t, Config{Journal: openJournal(t, path), Now: func() time.Time { return now }})

	page := get(t, c, srv.URL+"/ops?state=pending")
	assert.Contains(t, page.body, `<div id="live" data-src="/live/ops?state=pending">`)
	live := get(t, c, srv.URL+"/live/ops?state=pending")
	require.Equal(t, http.StatusOK, live.code)
	assert.NotContains(t, live.body, "<html")
	assert.NotContains(t, live.body, `id="filter"`, "the form is not in the live part")
	assert.Contains(t, page.body, strings.TrimSpace(live.body), "the live part is the page's inside")
	assert.Empty(t, live.header.Values("Set-Cookie"))

	// Another process (another handle on the file) writes.
	app, err := idem.OpenSQLite(path)
	require.NoError(t, err)
	defer app.Close()
	_, _, err = app.Create(context.Background(), idem.Record{Key: uuid.NewString(), Scope: "default", ID: "written/while-watching",
		Method: "POST", URL: "https://api.example.com/orders", Fingerprint: "f", KeyHeader: "Idempotency-Key", State: idem.StatePending})
	require.NoError(t, err)
	live = get(t, c, srv.URL+"/live/ops?state=pending")
	assert.Contains(t, live.body, "written/while-watching")
	total := regexp.MustCompile(`id="total">(\d+)<`)
	assert.Equal(t, []string{`id="total">13<`}, total.FindAllString(get(t, c, srv.URL+"/live/overview").body, -1))

	// An operation's page follows its state.
	opLive := "/live/op?key=" + keys[uitest.Unknown]
	assert.Contains(t, get(t, c, srv.URL+opLive).body, `<td id="state"><span class="state state-unknown">`)
	client, err := idem.New(idem.Config{Journal: app})
	require.NoError(t, err)
	require.NoError(t, client.Reconcile(context.Background(), keys[uitest.Unknown], idem.StateRejected, "refunded by hand"))
	require.NoError(t, client.Close())
	a := get(t, c, srv.URL+opLive)
	assert.Contains(t, a.body, `<td id="state"><span class="state state-rejected">`)
	assert.Contains(t, a.body, "refunded by hand")
}

// live.js fetches the live part named by data-src every 2 seconds and
// swaps it in; no page carries inline script, so this file is the whole
// of it.
func TestLiveScript(t *testing.T) {
	t.Parallel()
	path, _ := fixtureJournal(t)
	srv, c := server(t, Config{Journal: openJournal(t, path)})
	js := get(t, c, srv.URL+"/static/live.js").body
	assert.Contains(t, js, "live.dataset.src")
	assert.Contains(t, js, "setInterval(refresh, 2000)")
}

// The timeline draws attempts, waits and status checks from the history.
func TestTimeline(t *testing.T) {
	t.Parallel()
	path, keys := fixtureJournal(t)
	srv, c := server(t, Config{Journal: openJournal(t, path)})
	count := func(name, class string) int {
		body := get(t, c, srv.URL+"/op?key="+keys[name]).body
		require.Contains(t, body, `<div class="timeline" id="timeline">`, name)
		return strings.Count(body, `<g class="`+class+`">`)
	}
	// Two attempts around a 1 s Retry-After.
	assert.Equal(t, 2, count(uitest.SucceededWait, "box attempt"))
	assert.Equal(t, 1, count(uitest.SucceededWait, "box wait"))
	assert.Equal(t, 0, count(uitest.SucceededWait, "mark status"))
	// An answer lost, a status check that found it.
	assert.Equal(t, 1, count(uitest.SucceededStatus, "box attempt"))
	assert.Equal(t, 1, count(uitest.SucceededStatus, "mark status"))
	// An answer lost, a status check that failed, one wait going on
	// since the answer was lost, through the check, until the next is due.
	assert.Equal(t, 1, count(uitest.Unknown, "mark status-failed"))
	assert.Equal(t, 1, count(uitest.Unknown, "box wait"))
	assert.Regexp(t, `<title>unknown from [^<]* for [^<]*, then due again at [^<]*</title>`,
		get(t, c, srv.URL+"/op?key="+keys[uitest.Unknown]).body)
	// Never sent: no attempt.
	assert.Equal(t, 0, count(uitest.Pending, "box attempt"))
	assert.Equal(t, 1, count(uitest.Pending, "box wait"))

	body := get(t, c, srv.URL+"/op?key="+keys[uitest.SucceededWait]).body
	assert.Contains(t, body, "waited 1.0s before attempt 2")
	assert.Regexp(t, `<title>attempt 2 from [^<]*: HTTP 201, succeeded</title>`, body)
}

// A timeline of events at one instant, or none, still draws.
func TestTimelineEdges(t *testing.T) {
	t.Parallel()
	now := time.Now()
	rec := idem.Record{State: idem.StateSucceeded}
	assert.Nil(t, newTimeline(rec, nil, now))
	hist := []idem.Event{{Version: 1, At: now, Kind: idem.EventCreate, To: idem.StateInFlight, Attempt: 1},
		{Version: 2, At: now, Kind: idem.EventAnswer, From: idem.StateInFlight, To: idem.StateSucceeded, Attempt: 1, StatusCode: 201}}
	tl := newTimeline(rec, hist, now.Add(time.Hour))
	require.NotNil(t, tl)
	require.Len(t, tl.Boxes, 3, "the state, the attempt, the settled state's cap")
	assert.Greater(t, tl.Boxes[1].W, 0.0)
	assert.Equal(t, tl.Boxes[0].X+tl.Boxes[0].W, tl.Marks[1].X, "a settled operation ends with its last event, not now")
	assert.Equal(t, "state-succeeded", tl.Boxes[2].Class)
	assert.Equal(t, tl.Marks[1].X, tl.Boxes[2].X)
}
