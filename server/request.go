package server

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/idemkit/idem/internal/wire"
)

// readKey reads the request's key in either syntax, or answers 400.
func (m *Middleware) readKey(w http.ResponseWriter, r *http.Request) (string, bool) {
	values := r.Header.Values(m.header)
	if len(values) > 1 {
		writeProblem(w, wire.Problem{Type: wire.ProblemKeyInvalid, Status: http.StatusBadRequest, Title: "Invalid idempotency key",
			Detail: fmt.Sprintf("The request carries %d %s headers; send exactly one.", len(values), m.header)})
		return "", false
	}
	var raw string
	if len(values) == 1 {
		raw = values[0]
	}
	key, err := wire.ParseKey(raw)
	switch {
	case errors.Is(err, wire.ErrKeyMissing):
		writeProblem(w, wire.Problem{Type: wire.ProblemKeyMissing, Status: http.StatusBadRequest, Title: "Idempotency key missing",
			Detail: fmt.Sprintf("%s %s requires an %s header: one unique key (a UUID) per operation, the same on every retry.", r.Method, r.URL.Path, m.header)})
		return "", false
	case err != nil:
		writeProblem(w, wire.Problem{Type: wire.ProblemKeyInvalid, Status: http.StatusBadRequest, Title: "Invalid idempotency key",
			Detail: fmt.Sprintf("%s: %v.", m.header, err)})
		return "", false
	case key == "." || key == "..":
		// Valid tokens, but dot segments: a URL path cannot name them
		// (ServeMux, and any client or proxy that follows RFC 3986,
		// resolves /idempotency/.. to /), so the status of such a key could
		// never be asked. The idem client mints UUIDs, never these.
		writeProblem(w, wire.Problem{Type: wire.ProblemKeyInvalid, Status: http.StatusBadRequest, Title: "Invalid idempotency key",
			Detail: fmt.Sprintf("%s %q is a dot segment, which a URL path cannot carry, so its status could not be asked; use another key (a UUID).", m.header, key)})
		return "", false
	case len(key) > m.cfg.MaxKeyLength:
		writeProblem(w, wire.Problem{Type: wire.ProblemKeyInvalid, Status: http.StatusBadRequest, Title: "Invalid idempotency key",
			Detail: fmt.Sprintf("%s is %d bytes long; at most %d are accepted.", m.header, len(key), m.cfg.MaxKeyLength)})
		return "", false
	}
	return key, true
}

// readBody reads the whole request body, which the fingerprint covers, or
// answers 413 or 400 and returns that status.
func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request, key string) ([]byte, int) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, 0
	}
	body, err := readAll(http.MaxBytesReader(w, r.Body, m.cfg.MaxBodyBytes), r.ContentLength, m.cfg.MaxBodyBytes)
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeProblem(w, wire.Problem{Type: wire.ProblemBodyTooLarge, Status: http.StatusRequestEntityTooLarge, Title: "Request body too large",
			Detail: fmt.Sprintf("The request body is over %d bytes, the most this idempotent route accepts.", m.cfg.MaxBodyBytes), Key: key})
		return nil, http.StatusRequestEntityTooLarge
	case err != nil:
		writeProblem(w, wire.Problem{Status: http.StatusBadRequest,
			Detail: "The request body could not be read to the end; nothing was run.", Key: key})
		return nil, http.StatusBadRequest
	}
	return body, 0
}

// readAll reads r to its end, as io.ReadAll does, into a buffer sized for
// the declared length (when it is known and at most limit) plus the byte
// that finds the end: a body read in one allocation of its own size,
// rather than io.ReadAll's 512 bytes at least, and its doublings above.
func readAll(r io.Reader, declared, limit int64) ([]byte, error) {
	if declared < 0 || declared > limit {
		return io.ReadAll(r)
	}
	b := make([]byte, 0, declared+1)
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // longer than declared: grow as append does
		}
	}
}

// problemKeyReused answers a request whose key is held by an entry of
// another request: another route, or the same route with another query or
// body.
func (m *Middleware) problemKeyReused(w http.ResponseWriter, r *http.Request, key string, e *Entry) {
	detail := "This idempotency key was already used with a different request body or query; use a new key for a new operation."
	if e.Method != r.Method || e.Path != r.URL.Path {
		detail = fmt.Sprintf("This idempotency key was first used on %s %s; a key belongs to one operation on one route.", e.Method, e.Path)
	}
	writeProblem(w, wire.Problem{Type: wire.ProblemKeyReused, Status: http.StatusUnprocessableEntity,
		Title: "Idempotency key reused", Detail: detail, Key: key})
}

// target is the request's path and raw query, as the client sent them.
func target(u *url.URL) string {
	if u.RawQuery == "" {
		return u.EscapedPath()
	}
	return u.EscapedPath() + "?" + u.RawQuery
}

// fingerprint is a digest of what makes a request the same request: its
// method, target and body, each length-prefixed (wire.Fingerprint) so that
// no two different requests hash the same bytes.
func fingerprint(method, target string, body []byte) string {
	f := wire.NewFingerprint()
	f.String(method)
	f.String(target)
	f.Bytes(body)
	return f.Sum()
}
