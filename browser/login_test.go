package browser

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/uitest"
)

// After the login, Chromium stays on idem ui whatever "next" the link
// carried: each hostile value lands on the overview, and no script of the
// link runs.
//
// The machine has no network, and Chromium stays on the page it was on
// when a navigation fails, so the final URL alone would not show a
// redirect elsewhere. Every host name but 127.0.0.1 is therefore mapped
// to a server of the test's own ("elsewhere"), as a phishing site would
// be reached: a redirect off the view lands there, shows in the final
// URL, and the server notes the page asked.
func TestLoginStaysOnTheViewInABrowser(t *testing.T) {
	const token = "s3cret-t0ken-for-the-browser"
	t.Setenv("IDEM_UI_TEST_TOKEN", token)
	elsewhere := newElsewhere(t)
	b := browse(t, chromedp.Flag("host-resolver-rules", "MAP * "+elsewhere.addr+", EXCLUDE 127.0.0.1"))
	jt, _ := sqliteFixture(t)
	u := startUI(t, jt, "--token-env", "IDEM_UI_TEST_TOKEN")
	origin, err := url.Parse(u.url)
	require.NoError(t, err)

	// The mapping works: a link elsewhere reaches the server elsewhere.
	// (Chromium's own background requests reach it too: only visits to
	// evil.example, which every hostile value names, count.)
	b.open("http://probe.example/", "#elsewhere")
	require.Contains(t, elsewhere.visits(), "probe.example/", "Chromium did not reach the server elsewhere")

	// Log-in links: each hostile value as a page would encode it, and
	// links written by hand the way a phishing mail would.
	var links []string
	for _, next := range uitest.HostileNexts {
		links = append(links, u.url+"/login?next="+url.QueryEscape(next))
	}
	for _, raw := range []string{
		"/%09/evil.example/phish", "/%0A/evil.example", "/%0D%0A/evil.example", "//evil.example",
		"/%5Cevil.example", "%2F%2Fevil.example", "/%2F/evil.example", "%5C%5Cevil.example",
		"javascript:window.pwned=1", "https://evil.example/", "//127.0.0.1@evil.example",
		"/\t/evil.example", `/\evil.example`,
	} {
		links = append(links, u.url+"/login?next="+raw)
	}
	// Pages asked for without the token: the login form they answer
	// with carries them as next.
	for _, p := range []string{"//evil.example/x", "/%2F/evil.example", "/%5C/evil.example", "/ops/..%2F..%2Fevil.example"} {
		links = append(links, u.url+p)
	}

	for _, link := range links {
		b.logOut()
		b.open(link, `input[name="token"]`)
		blocked := b.logIn(token)
		assert.Empty(t, blocked, "link %q: the login led to a page the view's Content-Security-Policy blocked", link)
		loc := run(b, chromedp.Location())
		got, err := url.Parse(loc)
		require.NoError(t, err, "link %q: Chromium is at %q", link, loc)
		assert.Equal(t, origin.Scheme+"://"+origin.Host, got.Scheme+"://"+got.Host, "link %q: Chromium left idem ui for %q", link, loc)
		assert.Equal(t, u.url+"/", loc, "link %q: the login lands on the overview", link)
		assert.Equal(t, 1, b.count("#total"), "link %q: the overview is shown", link)
		assert.Nil(t, b.pwned(), "link %q: a script of the link ran", link)
	}
	var visits []string
	for _, v := range elsewhere.visits() {
		if strings.HasPrefix(v, "evil.example") {
			visits = append(visits, v)
		}
	}
	assert.Empty(t, visits, "pages elsewhere that a login led to")

	// What Chromium makes of each Location the login answers, the
	// Content-Security-Policy aside (it is the page's, not the view's
	// answer, and not every browser enforces form-action on redirects):
	// resolved against the login's URL by Chromium's own URL parser, each
	// stays on the view.
	b.open(u.url+"/", "#total")
	for _, next := range uitest.HostileNexts {
		loc := loginLocation(t, u.url, token, next)
		resolved := run(b, chromedp.Evaluate[string](fmt.Sprintf(`new URL(%s, %q).href`, jsString(loc), u.url+"/login")))
		assert.Equal(t, u.url+"/", resolved, "next %q: the login answers Location %q", next, loc)
	}

	// A page of the view comes back after the login.
	b.logOut()
	b.open(u.url+"/login?next="+url.QueryEscape("/ops?state=unknown"), `input[name="token"]`)
	b.logIn(token)
	assert.Equal(t, u.url+"/ops?state=unknown", run(b, chromedp.Location()))
	assert.Contains(t, b.text("#ops"), "pay/invoice-7")
}

// elsewhere is a web server off the view, where Chromium is sent for any
// other host name; it notes the pages asked of it.
type elsewhere struct {
	addr string
	mu   sync.Mutex
	seen []string
}

func newElsewhere(t *testing.T) *elsewhere {
	t.Helper()
	e := &elsewhere{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.seen = append(e.seen, r.Host+r.URL.Path)
		e.mu.Unlock()
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(`<!doctype html><title>elsewhere</title><p id="elsewhere">Enter the token again</p>`))
	}))
	t.Cleanup(srv.Close)
	e.addr = srv.Listener.Addr().String()
	return e
}

// visits are the pages asked of the server, as host and path.
func (e *elsewhere) visits() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.seen...)
}

// logOut forgets the session cookie, as a new browser would have none.
func (tb *tab) logOut() {
	tb.t.Helper()
	tb.do(func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, t, network.ClearBrowserCookies, cdp.Empty{})
		return chromedp.Void{}, err
	})
}

// logIn submits the login form shown with token, and waits for the page
// it leads to, wherever that is (a document without the mark set on the
// form's page, completely loaded), or for the page's Content-Security-
// Policy to block where it leads. It returns the URL blocked, if any.
func (tb *tab) logIn(token string) string {
	tb.t.Helper()
	tb.do(chromedp.Evaluate[chromedp.Void](`window.loginForm = true; window.blocked = "";
		document.addEventListener("securitypolicyviolation", e => { window.blocked = e.blockedURI || e.violatedDirective })`),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		chromedp.Click(chromedp.CSS(`form.login button[type="submit"]`)))
	tb.eventually(`(window.loginForm === undefined && document.readyState === "complete") || window.blocked !== ""`)
	return run(tb, chromedp.Evaluate[string](`window.blocked || ""`))
}

// loginLocation logs in to the view at base with token and next, as the
// login form would, and returns the Location it answers, unparsed.
func loginLocation(t *testing.T, base, token, next string) string {
	t.Helper()
	form, err := http.Get(base + "/login")
	require.NoError(t, err)
	page, err := io.ReadAll(form.Body)
	form.Body.Close()
	require.NoError(t, err)
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindSubmatch(page)
	require.NotNil(t, m, "the login form has no CSRF token")
	req, err := http.NewRequest(http.MethodPost, base+"/login", strings.NewReader(
		url.Values{"csrf": {string(m[1])}, "next": {next}, "token": {token}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for _, c := range form.Cookies() {
		req.AddCookie(c)
	}
	// The transport, not a client: http.Client refuses to read some of
	// the Locations this is about.
	resp, err := http.DefaultTransport.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "next %q", next)
	return resp.Header.Get("Location")
}

// jsString is s as a JavaScript string literal.
func jsString(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}
