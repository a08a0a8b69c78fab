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

// ProblemHandlerPanicked is the problem type of the 500 the middleware
// stores for a key whose handler panicked (under StoreAll): the key's
// outcome is that failure, replayed to every retry.
const ProblemHandlerPanicked = "urn:idem:problem:handler-panicked"

// panicResponse is what is stored for a key whose handler panicked.
func panicResponse(key string) *StoredResponse {
	body, _ := json.Marshal(wire.Problem{
		Type: ProblemHandlerPanicked, Status: http.StatusInternalServerError, Title: "Handler failed",
		Detail: "The request's handler failed part-way, so it is not run again for this key: this failure is the key's outcome. " +
			"It may have acted before it failed; check before sending the operation again under a new key.",
		Key: key,
	})
	h := http.Header{}
	h.Set("Content-Type", wire.ProblemContentType)
	return &StoredResponse{Status: http.StatusInternalServerError, Header: h, Body: body}
}
