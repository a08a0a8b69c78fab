// Package webui is the web view of an idem journal that "idem ui" serves:
// an overview (counts by state and scope, the oldest unsettled operation),
// a filtered list paged through the journal with Filter.After, and an
// operation's page (its request and response, shown safely whatever their
// bytes, and a timeline of its attempts, waits and status checks). Each
// page has a live part that a small script re-fetches every two seconds
// while the application writes the journal.
//
// It is read-only unless Config.AllowWrites: then an unknown or expired
// operation may be reconciled, and a pending one canceled, from its page,
// by a POST carrying the process's CSRF token, with the rules and errors of
// "idem reconcile" and "idem cancel" (package operator).
//
// Without a token it answers only requests addressed to a loopback name
// (localhost, 127.0.0.1, [::1]), so that a web page elsewhere cannot reach
// it through DNS rebinding. With Config.Token, every request must carry
// the token: "Authorization: Bearer TOKEN", or the session cookie the
// login form sets.
//
// Everything shown is escaped by html/template; the pages load no inline
// script or style (the Content-Security-Policy forbids them), cannot be
// framed, and are served with nosniff.
package webui

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"time"

	"github.com/idemkit/idem"
)

// Config is what the view serves.
type Config struct {
	// Journal is the journal shown; the handler never closes it.
	Journal idem.Journal
	// Path is the journal's file, for its size on disk; empty leaves the
	// size out.
	Path string
	// AllowWrites shows the reconcile and cancel forms and accepts their
	// POSTs; without it every POST but the login is refused with 403.
	AllowWrites bool
	// Token, when not empty, is required of every request (but the login
	// form and the static files). When empty, only requests addressed to
	// a loopback name are served.
	Token string
	// Alive, when set, tells which workers are alive, for the overview's
	// list of workers (a PostgreSQL journal can tell; see
	// operator.Fleet). When nil, a worker's status is its leases'.
	Alive func(context.Context) (map[string]bool, error)
	// PageSize is the number of operations a list page shows; default 100.
	PageSize int
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// DefaultPageSize is the number of operations a list page shows.
const DefaultPageSize = 100

// Handler serves the view. Create it with New.
type Handler struct {
	cfg   Config
	mux   *http.ServeMux
	pages map[string]*template.Template
	// csrf is the per-process token every form carries and every POST
	// must return, in its form and in the SameSite cookie.
	csrf string
	// sessionKey signs the session cookie of a login, so that the cookie
	// never holds the token itself.
	sessionKey []byte
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// New returns the handler of cfg.
func New(cfg Config) (*Handler, error) {
	if cfg.Journal == nil {
		return nil, errors.New("webui: Config.Journal is nil")
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = DefaultPageSize
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux()}
	var secret [64]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return nil, fmt.Errorf("webui: drawing the CSRF token: %w", err)
	}
	h.csrf, h.sessionKey = hex.EncodeToString(secret[:32]), secret[32:]
	var err error
	if h.pages, err = parsePages(); err != nil {
		return nil, err
	}

	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET /{$}", h.overview)
	h.mux.HandleFunc("GET /live/overview", h.overview)
	h.mux.HandleFunc("GET /ops", h.list)
	h.mux.HandleFunc("GET /live/ops", h.list)
	h.mux.HandleFunc("GET /op", h.operation)
	h.mux.HandleFunc("GET /live/op", h.operation)
	h.mux.HandleFunc("POST /op/reconcile", h.reconcile)
	h.mux.HandleFunc("POST /op/cancel", h.cancel)
	h.mux.HandleFunc("GET /login", h.loginForm)
	h.mux.HandleFunc("POST /login", h.login)
	return h, nil
}

// ServeHTTP implements http.Handler: the security headers on every
// answer, then the guard (token or loopback Host), then the pages.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cache-Control", "no-store")
	if !h.admit(w, r) {
		return
	}
	h.mux.ServeHTTP(w, r)
}

func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range []string{"overview", "list", "op", "login", "error"} {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/base.html", "templates/parts.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("webui: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}
