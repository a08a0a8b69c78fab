package server

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// capture is the ResponseWriter a handler on an idempotent route writes
// to. It buffers the whole response, because the response must be stored
// before any of it reaches the client. It deliberately implements neither
// http.Flusher nor http.Hijacker nor Unwrap: http.ResponseController's
// Flush and Hijack then report http.ErrNotSupported instead of letting a
// handler send bytes that were never stored.
type capture struct {
	header      http.Header
	status      int
	sentHeader  http.Header // the header as it was when the status was set
	body        bytes.Buffer
	wroteHeader bool
}

func newCapture() *capture { return &capture{header: make(http.Header)} }

func (c *capture) Header() http.Header { return c.header }

func (c *capture) WriteHeader(code int) {
	// The same checks as net/http: a bad code is the handler's bug.
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if c.wroteHeader {
		return
	}
	// Informational answers (103 Early Hints) would reach the client before
	// the final response is stored; they are dropped.
	if code < 200 {
		return
	}
	c.wroteHeader = true
	c.status = code
	// As with net/http, changes to the header after WriteHeader are not
	// part of the response.
	c.sentHeader = c.header.Clone()
}

func (c *capture) Write(p []byte) (int, error) {
	if !c.wroteHeader {
		c.WriteHeader(http.StatusOK)
	}
	return c.body.Write(p)
}

// response returns what the handler wrote, as it is stored: with the
// Content-Type net/http would have sniffed, and without Set-Cookie, which
// belongs to the caller that got the first response only and is returned
// apart. The header is the copy taken when the status was set, which
// nothing else holds: it is the stored response's own.
func (c *capture) response() (resp *StoredResponse, cookies []string) {
	if !c.wroteHeader {
		c.WriteHeader(http.StatusOK)
	}
	h := c.sentHeader
	body := c.body.Bytes()
	if _, set := h["Content-Type"]; !set && len(body) > 0 && bodyAllowed(c.status) {
		h.Set("Content-Type", http.DetectContentType(body))
	}
	c.keepTrailers(h)
	return &StoredResponse{Status: c.status, Header: h, Body: body}, takeCookies(h)
}

// keepTrailers puts into h, the stored header, the trailers the handler
// set, in net/http's http.TrailerPrefix form ("Trailer:X-Sum"), which
// every store keeps as it keeps any header and which, set on a
// ResponseWriter before its body, net/http sends as a trailer: on the
// first answer and on every replay alike, with no change to any store's
// schema. They are the handler's live header's TrailerPrefix keys, set at
// any time, and the values of the names its Trailer header announced as
// they are once it returned (net/http sends those then, however late they
// were set, and a value already in the header at WriteHeader goes both
// there and, as it is at the end, as the trailer).
func (c *capture) keepTrailers(h http.Header) {
	for k, v := range c.header {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			h[k] = slices.Clone(v)
		}
	}
	for _, list := range h["Trailer"] {
		for name := range strings.SplitSeq(list, ",") {
			name = http.CanonicalHeaderKey(strings.TrimSpace(name))
			if name == "" {
				continue
			}
			if v, set := c.header[name]; set {
				h[http.TrailerPrefix+name] = slices.Clone(v)
			}
		}
	}
}

// takeCookies removes every Set-Cookie from h and returns their values:
// the canonical key's first, then those of other spellings
// (h["set-cookie"], which code that fills the map directly writes, and
// which net/http sends as it is), in the order of their names. Header
// names are case-insensitive: any spelling is a cookie to the client.
func takeCookies(h http.Header) []string {
	cookies := h["Set-Cookie"]
	delete(h, "Set-Cookie")
	var others []string
	for k := range h {
		switch {
		case strings.EqualFold(k, "Set-Cookie"):
			others = append(others, k)
		case strings.EqualFold(k, http.TrailerPrefix+"Set-Cookie"):
			delete(h, k) // a cookie as a trailer, which clients ignore: never stored
		}
	}
	slices.Sort(others)
	for _, k := range others {
		cookies = append(cookies, h[k]...)
		delete(h, k)
	}
	return cookies
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}
