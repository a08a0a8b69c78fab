package webui

import (
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/uitest"
)

// Every page shows the journal's hostile content escaped: no markup of
// the application's gets through as markup, no NUL or invalid byte
// reaches the page, credentials are hidden, and long values are cut.
func TestPagesEscapeHostileContent(t *testing.T) {
	t.Parallel()
	path, keys := fixtureJournal(t)
	srv, c := server(t, Config{Journal: openJournal(t, path), Path: path, AllowWrites: true})

	pages := []string{"/", "/live/overview", "/ops", "/live/ops", "/ops?scope=" + url.QueryEscape(uitest.MarkupScope),
		"/ops?q=" + url.QueryEscape("<script>"), "/ops?after=" + url.QueryEscape(`"><script>x</script>`),
		"/op?key=" + url.QueryEscape(`<script>alert(1)</script>`), "/ops?state=" + url.QueryEscape(`<img src=x onerror=alert(1)>`)}
	for _, name := range []string{uitest.HostileMarkup, uitest.HostileBytes, uitest.HostileLong} {
		pages = append(pages, "/op?key="+keys[name], "/live/op?key="+keys[name])
	}
	for _, p := range pages {
		a := get(t, c, srv.URL+p)
		assert.Less(t, a.code, 500, "%s: %s", p, a.body)
		checkSafe(t, p, a)
	}

	// The hostile values are there, escaped.
	a := get(t, c, srv.URL+"/op?key="+keys[uitest.HostileMarkup])
	assert.Contains(t, a.body, "&lt;script&gt;window.pwned=1&lt;/script&gt;&#34;&gt;&lt;img src=x onerror=&#34;window.pwned=2&#34;&gt;")
	assert.Contains(t, a.body, "&lt;/pre&gt;&lt;/textarea&gt;&lt;script&gt;window.pwned=5&lt;/script&gt;")
	assert.Contains(t, a.body, "&#34;&gt;&lt;script&gt;window.pwned=4&lt;/script&gt;")
	a = get(t, c, srv.URL+"/op?key="+keys[uitest.HostileBytes])
	assert.Contains(t, a.body, `&#34;bytes/\x00\xff\xfe&lt;script&gt;window.pwned=7&lt;/script&gt;&#34;`, "the ID, Go-quoted")
	assert.Contains(t, a.body, `<td id="link">&#34;&gt;&lt;script&gt;window.pwned=10&lt;/script&gt;</td>`, "the trace link, escaped")
	assert.Contains(t, a.body, "not text: a hex dump")
	assert.Contains(t, a.body, "00 ff fe 3c 73 63 72 69", "the body's bytes in hex")
	assert.Contains(t, a.body, "(a credential: not shown)")
	assert.NotContains(t, a.body, "secret-in-journal")
	assert.NotContains(t, a.body, "secret-cookie")

	// A 786 KB body, a 100 KB header value and a 20 KB ID make a page of
	// a few dozen KB.
	a = get(t, c, srv.URL+"/op?key="+keys[uitest.HostileLong])
	assert.Less(t, len(a.body), 200<<10, "the page of an operation with long values")
	assert.Contains(t, a.body, "the first 65536 shown")
	assert.Contains(t, a.body, "more characters not shown")
}

// checkSafe fails when a page carries the fixture's markup as markup, a
// NUL, invalid UTF-8, or lacks a security header.
func checkSafe(t *testing.T, page string, a answer) {
	t.Helper()
	for _, bad := range []string{"<script>window", "<script>alert", "<img src=x", "onerror=\"window", "<b id=pwned3>", "\x00"} {
		assert.NotContains(t, a.body, bad, "%s carries %q unescaped", page, bad)
	}
	assert.True(t, utf8.ValidString(a.body), "%s is not valid UTF-8", page)
	scripts := 1 // live.js, in the page's head
	if strings.HasPrefix(page, "/live/") {
		scripts = 0 // a live part is the page's inside
	}
	assert.Equal(t, scripts, strings.Count(a.body, "<script"), "%s: the one script is live.js", page)
	checkHeaders(t, page, a)
}

func checkHeaders(t *testing.T, page string, a answer) {
	t.Helper()
	csp := a.header.Get("Content-Security-Policy")
	assert.Contains(t, csp, "script-src 'self'", page)
	assert.NotContains(t, csp, "unsafe-inline", page)
	assert.Contains(t, csp, "frame-ancestors 'none'", page)
	assert.Equal(t, "nosniff", a.header.Get("X-Content-Type-Options"), page)
	assert.Equal(t, "DENY", a.header.Get("X-Frame-Options"), page)
}

// Static files, refusals and errors carry the security headers too, and
// no page has inline script or style.
func TestSecurityHeadersEverywhere(t *testing.T) {
	t.Parallel()
	path, _ := fixtureJournal(t)
	srv, c := server(t, Config{Journal: openJournal(t, path)})
	for _, p := range []string{"/static/live.js", "/static/idem.css", "/no-such-page", "/op?key=nope", "/op"} {
		checkHeaders(t, p, get(t, c, srv.URL+p))
	}
	checkHeaders(t, "POST /op/cancel", post(t, c, srv.URL+"/op/cancel", url.Values{"key": {"k"}}))
	a := get(t, c, srv.URL+"/static/live.js")
	require.Equal(t, 200, a.code)
	assert.Contains(t, a.header.Get("Content-Type"), "javascript")
	a = get(t, c, srv.URL+"/")
	assert.NotContains(t, a.body, "style=")
	assert.NotContains(t, a.body, "<style")
	assert.Contains(t, a.body, `<script src="/static/live.js" defer></script>`)
}
