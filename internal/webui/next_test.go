package webui

import (
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/uitest"
)

// A login sends the operator back only to one of the view's own pages,
// whatever "next" says: the hostile values land on "/", and a real page
// comes back with its query re-encoded.
func TestLoginSendsOnlyToTheViewsOwnPages(t *testing.T) {
	t.Parallel()
	const token = "s3cret-t0ken"
	path, _ := fixtureJournal(t)
	srv, c := server(t, Config{Journal: openJournal(t, path), Token: token})

	login := func(next string) string {
		t.Helper()
		form := get(t, c, srv.URL+"/login?next="+url.QueryEscape(next))
		require.Equal(t, http.StatusOK, form.code)
		// The form carries the next page as the login will use it.
		shown := formNext(t, form.body)
		// Sent through the transport: http.Client refuses to read
		// some of the Locations this test is about.
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/login", strings.NewReader(
			url.Values{"csrf": {csrfOf(t, form.body)}, "next": {next}, "token": {token}}.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for _, ck := range c.Jar.Cookies(req.URL) {
			req.AddCookie(ck)
		}
		resp, err := srv.Client().Transport.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, "next %q", next)
		loc := resp.Header.Get("Location")
		assert.Equal(t, loc, shown, "next %q: the form shows where the login goes", next)
		return loc
	}
	for _, next := range uitest.HostileNexts {
		assert.Equal(t, "/", login(next), "next %q", next)
		assert.Equal(t, "/", safeNext(next), "next %q", next)
	}
	// The link of the report, as a browser sends it.
	form := get(t, c, srv.URL+"/login?next=/%09/evil.example/phish")
	assert.Equal(t, "/", formNext(t, form.body))

	for next, want := range map[string]string{
		"/":                            "/",
		"/ops":                         "/ops",
		"/ops?state=unknown":           "/ops?state=unknown",
		"/ops?state=unknown&q=invoice": "/ops?q=invoice&state=unknown",
		"/ops?q=a%2Fb+c":               "/ops?q=a%2Fb+c",
		"/ops?q=//evil.example":        "/ops?q=%2F%2Fevil.example",
		"/op?key=0b9b9f0e-7b1c-4d0a":   "/op?key=0b9b9f0e-7b1c-4d0a",
		"/op?key=abc#timeline":         "/op?key=abc",
		"/ops?":                        "/ops",
		"/ops#//evil.example":          "/ops",
	} {
		assert.Equal(t, want, login(next), "next %q", next)
	}
}

// The login page that a request without the token gets carries that
// request's page as next, cleaned like any other.
func TestLoginPageOfAnUnauthenticatedRequestKeepsItsPage(t *testing.T) {
	t.Parallel()
	path, _ := fixtureJournal(t)
	srv, c := server(t, Config{Journal: openJournal(t, path), Token: "s3cret-t0ken"})
	for target, want := range map[string]string{
		"/ops?state=unknown": "/ops?state=unknown",
		"/op?key=abc":        "/op?key=abc",
		"//evil.example/x":   "/",
		"/%2F/evil.example":  "/",
	} {
		a := get(t, c, srv.URL+target)
		require.Equal(t, http.StatusUnauthorized, a.code, target)
		assert.Equal(t, want, formNext(t, a.body), target)
	}
}

// Every landing page is a page the view serves to a GET.
func TestLandingPagesAreServed(t *testing.T) {
	t.Parallel()
	path, _ := fixtureJournal(t)
	h, err := New(Config{Journal: openJournal(t, path)})
	require.NoError(t, err)
	for p := range landingPages {
		req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1"+p, nil)
		require.NoError(t, err)
		_, pattern := h.mux.Handler(req)
		assert.True(t, strings.HasPrefix(pattern, "GET /"), "%s is served by %q", p, pattern)
	}
}

// formNext is the next page a login form carries.
func formNext(t *testing.T, page string) string {
	t.Helper()
	const mark = `name="next" value="`
	i := strings.Index(page, mark)
	require.GreaterOrEqual(t, i, 0, "the page has no next field")
	rest := page[i+len(mark):]
	v := rest[:strings.IndexByte(rest, '"')]
	// html/template escapes the value; the login receives it unescaped.
	return html.UnescapeString(v)
}
