package server

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idem/internal/wire"
)

// writeProblem answers with an RFC 9457 problem. Problems are never stored:
// they are written before a handler runs, or instead of its response.
func writeProblem(w http.ResponseWriter, p wire.Problem) {
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	body, _ := json.Marshal(p)
	h := w.Header()
	h.Set("Content-Type", wire.ProblemContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

// retryAfter formats d as a Retry-After value: whole seconds, rounded up,
// at least one.
func retryAfter(d time.Duration) string {
	s := (d + time.Second - 1) / time.Second
	return strconv.FormatInt(int64(max(s, 1)), 10)
}

// problemInProgress answers 409 in progress, with detail or else the
// default one.
func (m *Middleware) problemInProgress(w http.ResponseWriter, key, detail string) {
	if detail == "" {
		detail = "A request with this idempotency key is still being processed; retry after the delay in Retry-After, or ask the status endpoint."
	}
	w.Header().Set("Retry-After", m.retryAfter)
	writeProblem(w, wire.Problem{
		Type: wire.ProblemInProgress, Status: http.StatusConflict, Title: "Request in progress",
		Detail: detail, Key: key,
	})
}

func (m *Middleware) problemStoreFailed(w http.ResponseWriter, key, detail string) {
	w.Header().Set("Retry-After", m.retryAfter)
	writeProblem(w, wire.Problem{
		Type: wire.ProblemStoreFailed, Status: http.StatusServiceUnavailable, Title: "Idempotency store unavailable",
		Detail: detail, Key: key,
	})
}
