package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/idemkit/idem/internal/wire"
)

// StatusHandler answers GET {prefix}/{key} with what the store knows about
// the key in the caller's scope (Config.Scope of the status request), in
// the shape of wire.Status. Mount it behind the same authentication as the
// routes, so that Scope reads the caller's tenant: a key of another scope
// reads as not_found, and its response is never sent.
//
// The answers:
//
//   - 200 {"key":…,"state":"processing"} while a handler runs under the
//     key, or its response waits to be stored, and its lock is fresh;
//   - 200 {"key":…,"state":"completed","response":{…}} with the stored
//     status, headers and body;
//   - 404 {"key":…,"state":"not_found"} when there is no entry: the key was
//     never seen within the retention, was swept, or was released (under
//     SkipServerErrors, after a 5xx or a panic). A request sent now with
//     the key runs the handler.
//   - 404 not_found as well when the entry is in progress but its lock is
//     stale: its process died (or lost its store), and the next request with the key and the
//     same payload takes the entry over and runs the handler. not_found
//     tells the client exactly that: send the request (with the same key).
//
// The key is r.PathValue("key") when the route has that wildcard (mount it
// as "GET /idempotency/{key}"), else the last segment of the path,
// unescaped. HEAD is answered as GET, without the body; another method gets
// 405; a store failure gets 503, so
// that a client never reads a failure as not_found.
func (m *Middleware) StatusHandler() http.Handler {
	return http.HandlerFunc(m.serveStatus)
}

func (m *Middleware) serveStatus(w http.ResponseWriter, r *http.Request) {
	// HEAD is GET without the body (RFC 9110 §9.3.2), which net/http
	// leaves out: a ServeMux pattern "GET /…" routes HEAD here too.
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeProblem(w, wire.Problem{Status: http.StatusMethodNotAllowed, Detail: "The status endpoint answers GET and HEAD only."})
		return
	}
	key, err := statusKey(r)
	if err == nil && key == "" {
		err = errors.New("the path names no key; ask GET …/{key}")
	}
	if err == nil && len(key) > m.cfg.MaxKeyLength {
		err = fmt.Errorf("the key is %d bytes long; keys are at most %d", len(key), m.cfg.MaxKeyLength)
	}
	if err != nil {
		writeProblem(w, wire.Problem{Type: wire.ProblemKeyInvalid, Status: http.StatusBadRequest, Title: "Invalid idempotency key", Detail: err.Error() + "."})
		return
	}
	scope := m.cfg.Scope(r)
	now := m.cfg.now()
	e, err := m.cfg.Store.Get(r.Context(), scope, key, now)
	switch {
	case errors.Is(err, ErrNotFound):
		writeStatus(w, http.StatusNotFound, wire.Status{Key: key, State: wire.StateNotFound})
	case err != nil:
		m.log(r.Context(), slog.LevelError, "idempotency status lookup failed", r, scope, key, slog.Any("error", err))
		m.problemStoreFailed(w, key, "The idempotency store could not be read; the outcome is unknown, ask again later.")
	case e.State == Completed && e.Response != nil:
		writeStatus(w, http.StatusOK, wire.Status{Key: key, State: wire.StateCompleted,
			Response: wire.NewResponse(e.Response.Status, e.Response.Header, e.Response.Body)})
	case e.LockedAt.Before(now.Add(-m.cfg.LockTimeout)):
		writeStatus(w, http.StatusNotFound, wire.Status{Key: key, State: wire.StateNotFound})
	default:
		writeStatus(w, http.StatusOK, wire.Status{Key: key, State: wire.StateProcessing})
	}
}

func statusKey(r *http.Request) (string, error) {
	if k := r.PathValue("key"); k != "" {
		return k, nil
	}
	p := r.URL.EscapedPath()
	seg := p[strings.LastIndexByte(p, '/')+1:]
	k, err := url.PathUnescape(seg)
	if err != nil {
		return "", fmt.Errorf("the key in the path is not validly escaped: %v", err)
	}
	return k, nil
}

func writeStatus(w http.ResponseWriter, code int, s wire.Status) {
	body, _ := json.Marshal(s) // strings and ints only: it cannot fail
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
