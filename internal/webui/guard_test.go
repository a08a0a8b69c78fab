package webui

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Without a token the view answers only requests addressed to a loopback
// name: a page elsewhere that rebinds its DNS name to 127.0.0.1 is
// refused.
func TestWithoutATokenOnlyLoopbackHostsAreServed(t *testing.T) {
	t.Parallel()
	path, _ := fixtureJournal(t)
	srv, c := server(t, Config{Journal: openJournal(t, path)})
	for host, want := range map[string]int{
		"":                       http.StatusOK, // the server's own 127.0.0.1:port
		"localhost:8080":         http.StatusOK,
		"[::1]:8080":             http.StatusOK,
		"127.0.0.2":              http.StatusOK,
		"evil.example:8080":      http.StatusForbidden,
		"10.0.0.1:8080":          http.StatusForbidden,
		"localhost.evil.example": http.StatusForbidden,
	} {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
		require.NoError(t, err)
		if host != "" {
			req.Host = host
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, want, resp.StatusCode, "Host %q", host)
	}
}

// With a token, every request needs it: as a bearer token, or through
// the session cookie of the login form; the cookie is not the token.
func TestTokenIsRequired(t *testing.T) {
	t.Parallel()
	const token = "s3cret-t0ken"
	path, _ := fixtureJournal(t)
	srv, c := server(t, Config{Journal: openJournal(t, path), Token: token})

	a := get(t, c, srv.URL+"/ops?state=unknown")
	assert.Equal(t, http.StatusUnauthorized, a.code)
	assert.Contains(t, a.body, `action="/login"`, "a page asks to log in")
	assert.Contains(t, a.body, `name="next" value="/ops?state=unknown"`)
	assert.NotContains(t, a.body, "checkout/cart", "and shows nothing of the journal")
	checkHeaders(t, "login", a)
	a = get(t, c, srv.URL+"/live/overview")
	assert.Equal(t, http.StatusUnauthorized, a.code)
	assert.Equal(t, `Bearer realm="idem ui"`, a.header.Get("WWW-Authenticate"))
	assert.Equal(t, http.StatusUnauthorized, do(t, c, http.MethodGet, srv.URL+"/", nil,
		http.Header{"Authorization": {"Bearer wrong"}}).code)
	a = do(t, c, http.MethodGet, srv.URL+"/", nil, http.Header{"Authorization": {"Bearer " + token}})
	assert.Equal(t, http.StatusOK, a.code)
	assert.Contains(t, a.body, `id="total"`)
	assert.NotContains(t, a.body, token, "the token is never shown")
	// A token view serves any Host: the token guards it.
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
	require.NoError(t, err)
	req.Host, req.Header = "ops.example:8080", http.Header{"Authorization": {"Bearer " + token}}
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	// The login form: a wrong token, then the right one.
	login := get(t, c, srv.URL+"/login?next=/ops")
	require.Equal(t, http.StatusOK, login.code)
	csrf := csrfOf(t, login.body)
	a = post(t, c, srv.URL+"/login", url.Values{"csrf": {csrf}, "next": {"/ops"}, "token": {"wrong"}})
	assert.Equal(t, http.StatusUnauthorized, a.code)
	assert.Contains(t, a.body, "That is not the token")
	a = post(t, c, srv.URL+"/login", url.Values{"next": {"/ops"}, "token": {token}})
	assert.Equal(t, http.StatusForbidden, a.code, "a login without the CSRF token")
	a = post(t, c, srv.URL+"/login", url.Values{"csrf": {csrf}, "next": {"//evil.example/"}, "token": {token}})
	require.Equal(t, http.StatusSeeOther, a.code)
	assert.Equal(t, "/", a.header.Get("Location"), "a redirect stays on the site")
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	var session string
	for _, ck := range c.Jar.Cookies(u) {
		if ck.Name == sessionCookie {
			session = ck.Value
		}
	}
	require.NotEmpty(t, session)
	assert.False(t, strings.Contains(session, token), "the cookie does not hold the token")
	a = get(t, c, srv.URL+"/ops")
	assert.Equal(t, http.StatusOK, a.code)
	assert.Contains(t, a.body, "checkout/cart-1")
}
