package webui

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/operator"
)

// page is what every page's frame shows.
type page struct {
	Title       string
	AllowWrites bool
	LoggedIn    bool // a token guards the view
	CSRF        string
	// Live is the URL of the page's live part, which live.js re-fetches.
	Live string
	Now  string
}

func (h *Handler) page(r *http.Request, title string) page {
	return page{Title: title, AllowWrites: h.cfg.AllowWrites, LoggedIn: h.cfg.Token != "", CSRF: h.csrf,
		Now: h.cfg.Now().UTC().Format(operator.TimeLayout)}
}

// isLive reports whether r asks for a page's live part only.
func isLive(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/live/") }

// liveURL is the live part's URL of the page r asked for.
func liveURL(r *http.Request) string {
	u := url.URL{Path: "/live" + r.URL.Path, RawQuery: r.URL.RawQuery}
	if r.URL.Path == "/" {
		u.Path = "/live/overview"
	}
	return u.String()
}

// render writes page name with data, or only its live part for a live
// request. It renders to a buffer first, so that a template error is a
// 500, not half a page.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, code int, name string, data any) {
	tmpl := "page"
	if isLive(r) {
		tmpl = "live"
	}
	var buf bytes.Buffer
	if err := h.pages[name].ExecuteTemplate(&buf, tmpl, data); err != nil {
		http.Error(w, "idem ui: rendering the page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if !isLive(r) {
		h.setCSRFCookie(w)
	}
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// fail answers with an error page.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, code int, err error) {
	h.render(w, r, code, "error", errorPage{page: h.page(r, http.StatusText(code)), Code: code, Message: err.Error()})
}

type errorPage struct {
	page
	Code    int
	Message string
}

type loginPage struct {
	page
	Next  string
	Error string
}

// overviewPage is "/": the counts by state and scope, and the oldest
// unsettled operation.
type overviewPage struct {
	page
	Stats  operator.Stats
	States []stateCount
	Scopes []scopeRow
	// Oldest is the first unsettled operation in the journal's order, the
	// oldest created.
	Oldest    *row
	OldestAge string
	Size      string
	Workers   []workerRow
}

type stateCount struct {
	State string
	N     int
}

// workerRow is a worker of the fleet on the overview.
type workerRow struct {
	Owner, Status, Lease string
	Operations           int
}

type scopeRow struct {
	Scope, Shown string
	Total        int
	Counts       []int // by idem.States()
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := h.cfg.Now()
	counts, err := h.cfg.Journal.Count(ctx)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	st, err := operator.NewStats(h.cfg.Path, counts, now)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	var alive map[string]bool
	if h.cfg.Alive != nil {
		alive, err = h.cfg.Alive(ctx)
		if errors.Is(err, operator.ErrLivenessUnknown) {
			st.LivenessUnknown, alive, err = operator.ErrLivenessUnknown.Error(), nil, nil
		}
		if err != nil {
			h.fail(w, r, http.StatusInternalServerError, err)
			return
		}
	}
	if st.Workers, err = operator.Fleet(ctx, h.cfg.Journal, alive, now); err != nil {
		h.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	p := overviewPage{page: h.page(r, "Journal"), Stats: st}
	for _, wk := range st.Workers {
		wr := workerRow{Owner: visible(wk.Owner, 80), Status: wk.Status, Operations: wk.Operations, Lease: "-"}
		if wk.OldestLease != nil {
			wr.Lease = "until " + operator.FormatTime(*wk.OldestLease, now)
		}
		p.Workers = append(p.Workers, wr)
	}
	p.Live = liveURL(r)
	if h.cfg.Path != "" {
		p.Size = fmt.Sprintf("%s (file %s, wal %s)", operator.FormatBytes(st.SizeBytes), operator.FormatBytes(st.FileBytes),
			operator.FormatBytes(st.WALBytes))
	}
	for _, s := range idem.States() {
		p.States = append(p.States, stateCount{State: s.String(), N: st.ByState[s.String()]})
	}
	for _, sc := range st.ByScope {
		row := scopeRow{Scope: sc.Scope, Shown: visible(sc.Scope, 80), Total: sc.Total}
		for _, s := range idem.States() {
			row.Counts = append(row.Counts, sc.ByState[s.String()])
		}
		p.Scopes = append(p.Scopes, row)
	}
	if st.OldestUnsettled != nil {
		p.OldestAge = operator.FormatAge(time.Duration(st.OldestUnsettled.AgeSeconds) * time.Second)
		for rec, err := range h.cfg.Journal.List(ctx, idem.Filter{States: operator.Unsettled}) {
			if err != nil {
				h.fail(w, r, http.StatusInternalServerError, err)
				return
			}
			row := newRow(rec, now)
			p.Oldest = &row
			break
		}
	}
	h.render(w, r, http.StatusOK, "overview", p)
}

// row is an operation in a list.
type row struct {
	Key, Scope, ID, State string
	PastRetention         bool
	Attempts              int
	Age, Error            string
}

func newRow(rec idem.Record, now time.Time) row {
	return row{Key: rec.Key, Scope: visible(rec.Scope, 40), ID: visible(rec.ID, 80), State: rec.State.String(),
		PastRetention: operator.PastRetention(rec, now), Attempts: rec.Attempts,
		Age: operator.FormatAge(now.Sub(rec.CreatedAt)), Error: visible(operator.LastError(rec), 120)}
}

// listPage is "/ops": one page of the operations that match a filter.
type listPage struct {
	page
	Query  listQuery
	States []stateOption
	Rows   []row
	// Next is the URL of the next page, empty on the last one; First the
	// URL of the first, empty on it.
	Next, First string
	Error       string
}

type stateOption struct {
	Name    string
	Checked bool
}

// listQuery is the list's filter, as the form and the URLs carry it.
type listQuery struct {
	States []string
	Scope  string
	Older  string
	Text   string
	After  string
}

func (q listQuery) values() url.Values {
	v := url.Values{}
	for _, s := range q.States {
		v.Add("state", s)
	}
	for name, val := range map[string]string{"scope": q.Scope, "older": q.Older, "q": q.Text, "after": q.After} {
		if val != "" {
			v.Set(name, val)
		}
	}
	return v
}

// parseListQuery reads the list's filter from the URL; what does not
// parse is an error for the page to say.
func parseListQuery(r *http.Request, now time.Time) (listQuery, idem.Filter, error) {
	v := r.URL.Query()
	q := listQuery{Scope: v.Get("scope"), Older: strings.TrimSpace(v.Get("older")), Text: v.Get("q"), After: v.Get("after")}
	f := idem.Filter{Scope: q.Scope, After: q.After}
	for _, s := range v["state"] {
		if s == "" {
			continue
		}
		st, err := idem.ParseState(s)
		if err != nil {
			return q, f, errors.New(strings.TrimPrefix(err.Error(), "idem: "))
		}
		q.States = append(q.States, st.String())
		f.States = append(f.States, st)
	}
	if q.Older != "" {
		d, err := operator.ParseAge(q.Older)
		if err != nil {
			return q, f, fmt.Errorf("older than: %w", err)
		}
		f.CreatedBefore = now.Add(-d)
	}
	return q, f, nil
}

// list pages through the journal: it reads from the cursor (the last key
// of the page before) and keeps PageSize rows, one more telling whether
// there is a next page. The text filter is applied here, as the records
// stream by, so that memory holds one page whatever the journal's size.
func (h *Handler) list(w http.ResponseWriter, r *http.Request) {
	now := h.cfg.Now()
	q, f, err := parseListQuery(r, now)
	p := listPage{page: h.page(r, "Operations"), Query: q}
	p.Live = liveURL(r)
	for _, s := range idem.States() {
		p.States = append(p.States, stateOption{Name: s.String(), Checked: contains(q.States, s.String())})
	}
	if err != nil {
		p.Error = err.Error()
		h.render(w, r, http.StatusBadRequest, "list", p)
		return
	}
	if q.After != "" {
		first := q
		first.After = ""
		p.First = "/ops?" + first.values().Encode()
	}
	text := strings.ToLower(q.Text)
	for rec, err := range h.cfg.Journal.List(r.Context(), f) {
		if err != nil {
			code := http.StatusInternalServerError
			if errors.Is(err, idem.ErrNotFound) {
				code = http.StatusNotFound
			}
			p.Error = err.Error()
			h.render(w, r, code, "list", p)
			return
		}
		if text != "" && !strings.Contains(strings.ToLower(rec.ID), text) {
			continue
		}
		if len(p.Rows) == h.cfg.PageSize {
			next := q
			next.After = p.Rows[len(p.Rows)-1].Key
			p.Next = "/ops?" + next.values().Encode()
			break
		}
		p.Rows = append(p.Rows, newRow(rec, now))
	}
	h.render(w, r, http.StatusOK, "list", p)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// opPage is "/op?key=KEY": one operation.
type opPage struct {
	page
	Key, Scope, ID, State   string
	KeyForm                 string
	Method, URL             string
	Fingerprint             string
	Attempts                string
	Created, Updated        string
	Expires, NextAttempt    string
	Lease, LastError, Note  string
	Link                    string // the trace that created it (Record.Link)
	Version                 int64
	PastRetention           bool
	Header                  []headerLine
	Body                    body
	Response                *responseView
	History                 []eventRow
	Timeline                *timeline
	CanReconcile, CanCancel bool
	// Done says what the last POST did; Error why it was refused.
	Done, Error string
	// As and NoteInput refill the reconcile form after an error.
	As, NoteInput string
}

type responseView struct {
	Status   string
	Replayed bool
	Header   []headerLine
	Body     body
}

type eventRow struct {
	Version                    int64
	At, Kind, Change, Owner    string
	Attempt                    int
	Status                     string
	Why                        string
	Operator, Failed, Answered bool
}

func (h *Handler) operation(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	p, code, err := h.opPage(r, key)
	if err != nil {
		h.fail(w, r, code, err)
		return
	}
	switch r.URL.Query().Get("done") {
	case "reconciled":
		p.Done = "Reconciled: the operator's decision is journaled."
	case "canceled":
		p.Done = "Canceled: the operation will never be sent."
	}
	h.render(w, r, http.StatusOK, "op", p)
}

// opPage reads the operation with key and lays out its page; the code
// goes with the error.
func (h *Handler) opPage(r *http.Request, key string) (opPage, int, error) {
	ctx := r.Context()
	now := h.cfg.Now()
	if key == "" {
		return opPage{}, http.StatusBadRequest, errors.New("no operation named: open one from the list (/op?key=KEY)")
	}
	rec, err := h.cfg.Journal.Get(ctx, key)
	if errors.Is(err, idem.ErrNotFound) {
		return opPage{}, http.StatusNotFound, fmt.Errorf("no operation has key %s in this journal (pruned?)", visible(key, 100))
	}
	if err != nil {
		return opPage{}, http.StatusInternalServerError, err
	}
	hist, err := h.cfg.Journal.History(ctx, key)
	if err != nil {
		return opPage{}, http.StatusInternalServerError, err
	}
	p := opPage{page: h.page(r, "Operation "+visible(rec.ID, 60)),
		Key: rec.Key, Scope: visible(rec.Scope, maxValue), ID: visible(rec.ID, maxValue), State: rec.State.String(),
		KeyForm: visible(operator.KeyFormText(rec), maxValue), Method: visible(rec.Method, 100), URL: visible(rec.URL, maxValue),
		Fingerprint: rec.Fingerprint, Attempts: strconv.Itoa(rec.Attempts),
		Created: operator.FormatTime(rec.CreatedAt, now), Updated: operator.FormatTime(rec.UpdatedAt, now),
		Expires: operator.FormatTime(rec.ExpiresAt, now), NextAttempt: operator.FormatTime(rec.NextAttemptAt, now),
		Lease: "none", LastError: visible(rec.LastError, maxValue), Note: visible(rec.Note, maxValue), Link: visible(rec.Link, maxValue), Version: rec.Version,
		PastRetention: operator.PastRetention(rec, now),
		Header:        headerLines(rec.Header), Body: newBody(rec.Body),
		Timeline: newTimeline(rec, hist, now),
	}
	p.Live = liveURL(r)
	if n := rec.TransportResends; n > 0 {
		p.Attempts += fmt.Sprintf(", and %d re-send(s) by Go's HTTP transport on its own (each may have reached the server)", n)
	}
	if l := rec.Lease; l.Owner != "" {
		p.Lease = fmt.Sprintf("%s, epoch %d, until %s", visible(l.Owner, 200), l.Epoch, operator.FormatTime(l.ExpiresAt, now))
		if !l.Held(now) {
			p.Lease += " (expired)"
		}
	}
	if resp := rec.Response; resp != nil {
		p.Response = &responseView{Status: strings.TrimSpace(fmt.Sprintf("%d %s", resp.StatusCode, http.StatusText(resp.StatusCode))),
			Replayed: resp.Replayed, Header: headerLines(resp.Header), Body: newBody(resp.Body)}
	}
	prevError := ""
	for _, ev := range hist {
		er := eventRow{Version: ev.Version, At: ev.At.UTC().Format(operator.TimeLayout), Kind: ev.Kind.String(),
			Change: operator.StateChange(ev), Owner: visible(ev.Owner, 200), Attempt: ev.Attempt, Status: "-",
			Why: visible(operator.EventWhy(ev, prevError), maxValue), Operator: ev.Kind == idem.EventOperator,
			Failed: ev.Kind == idem.EventStatus && ev.From == ev.To}
		if ev.StatusCode != 0 {
			er.Status = strconv.Itoa(ev.StatusCode)
		}
		prevError = ev.Error
		p.History = append(p.History, er)
	}
	// The forms the state allows; the rules themselves are the client's
	// (package operator), which may still refuse.
	switch rec.State {
	case idem.StateUnknown, idem.StateExpired, idem.StateInFlight:
		p.CanReconcile = h.cfg.AllowWrites
	case idem.StatePending:
		p.CanCancel = h.cfg.AllowWrites
	}
	return p, http.StatusOK, nil
}

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"px": func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"add": func(a, b float64) float64 {
		return a + b
	},
}
