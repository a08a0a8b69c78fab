package webui

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Cookie names.
const (
	// csrfCookie holds the CSRF token for the double submit: a POST must
	// carry it in its form and in this cookie, which SameSite=Strict keeps
	// from other sites' requests.
	csrfCookie = "idem_ui_csrf"
	// sessionCookie is set by a login: a MAC of the token under a
	// per-process key, never the token itself.
	sessionCookie = "idem_ui_session"
)

// admit lets a request through the guard, or answers it and returns false.
// Without a token only loopback Host names are served; with one, the
// request must carry it (the login form and the static files excepted).
func (h *Handler) admit(w http.ResponseWriter, r *http.Request) bool {
	if h.cfg.Token == "" {
		if !loopbackHost(r.Host) {
			// A page elsewhere that made its name resolve to 127.0.0.1
			// (DNS rebinding) would send its own name here.
			http.Error(w, "idem ui: refused: Host "+quoteHost(r.Host)+" is not a loopback name; without a token "+
				"idem ui answers only requests to localhost, 127.0.0.1 or [::1]", http.StatusForbidden)
			return false
		}
		return true
	}
	if r.URL.Path == "/login" || strings.HasPrefix(r.URL.Path, "/static/") || h.authenticated(r) {
		return true
	}
	if r.Method == http.MethodGet && !strings.HasPrefix(r.URL.Path, "/live/") {
		h.render(w, r, http.StatusUnauthorized, "login", loginPage{page: h.page(r, "Log in"), Next: safeNext(r.URL.RequestURI())})
		return false
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="idem ui"`)
	http.Error(w, "idem ui: the token is required: send Authorization: Bearer TOKEN, or log in at /login", http.StatusUnauthorized)
	return false
}

// authenticated reports whether r carries the token, as a bearer token or
// through the session cookie of a login.
func (h *Handler) authenticated(r *http.Request) bool {
	if auth, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return equal(strings.TrimSpace(auth), h.cfg.Token)
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		return equal(c.Value, h.session())
	}
	return false
}

// session is the session cookie's value: a MAC of the token, so that the
// cookie never holds the token and is worthless to another process.
func (h *Handler) session() string {
	m := hmac.New(sha256.New, h.sessionKey)
	m.Write([]byte(h.cfg.Token))
	return hex.EncodeToString(m.Sum(nil))
}

// equal compares secrets in constant time.
func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// setCSRFCookie sets the CSRF cookie on a page that carries a form.
func (h *Handler) setCSRFCookie(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: h.csrf, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
}

// checkCSRF reports whether a POST carries the CSRF token both in its
// form and in its cookie.
func (h *Handler) checkCSRF(r *http.Request) bool {
	c, err := r.Cookie(csrfCookie)
	return err == nil && equal(c.Value, h.csrf) && equal(r.PostFormValue("csrf"), h.csrf)
}

// refuseCSRF answers a POST without the right token.
func refuseCSRF(w http.ResponseWriter) {
	http.Error(w, "idem ui: refused: the form's CSRF token is missing or wrong (a request from another site, or "+
		"a page from before idem ui restarted): reload the page and try again", http.StatusForbidden)
}

// loopbackHost reports whether host (a Host header, with or without a
// port) names this machine's loopback interface.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// quoteHost quotes a Host header for a message, cut short.
func quoteHost(host string) string {
	if len(host) > 100 {
		host = host[:100] + "…"
	}
	return `"` + strings.ToValidUTF8(host, "?") + `"`
}

// loginForm is GET /login.
func (h *Handler) loginForm(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Token == "" {
		http.NotFound(w, r)
		return
	}
	h.render(w, r, http.StatusOK, "login", loginPage{page: h.page(r, "Log in"), Next: safeNext(r.URL.Query().Get("next"))})
}

// login is POST /login: the token in a form, answered with the session
// cookie.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Token == "" {
		http.NotFound(w, r)
		return
	}
	if !h.checkCSRF(r) {
		refuseCSRF(w)
		return
	}
	next := safeNext(r.PostFormValue("next"))
	if !equal(r.PostFormValue("token"), h.cfg.Token) {
		h.render(w, r, http.StatusUnauthorized, "login", loginPage{page: h.page(r, "Log in"), Next: next, Error: "That is not the token idem ui was started with."})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: h.session(), Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// landingPages are the pages a login may send the operator back to: the
// view's own pages, by their exact path. Anything else (another host, a
// script, a path a browser reads differently than Go does) lands on "/".
var landingPages = map[string]bool{"/": true, "/ops": true, "/op": true}

// safeNext is where a login sends the operator: next when it is one of
// the landing pages with a query, re-encoded; "/" otherwise.
//
// The check is an allowlist, not a list of tricks: browsers drop tabs and
// newlines from a Location, read a backslash as a slash and decode some
// escapes, so "/\t/evil.example" reaches evil.example although it starts
// with one slash. Anything but printable ASCII is refused, the path must
// match a landing page byte for byte (no escapes, no dot segments), and the
// query is parsed and written again, so that what is sent back is a URL
// the view built, never a string the request chose.
func safeNext(next string) string {
	for i := 0; i < len(next); i++ {
		if c := next[i]; c <= ' ' || c >= 0x7f || c == '\\' {
			return "/"
		}
	}
	next, _, _ = strings.Cut(next, "#")
	path, rawQuery, _ := strings.Cut(next, "?")
	if !landingPages[path] {
		return "/"
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return "/"
	}
	if len(q) == 0 {
		return path
	}
	return path + "?" + q.Encode()
}
