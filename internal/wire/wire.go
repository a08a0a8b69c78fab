// Package wire holds the wire conventions that the client (package idem)
// and the server middleware (package server) share: the key header and its
// two syntaxes, the replay headers, the status endpoint's JSON shape, and
// the problem types of errors.
package wire

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
)

// KeyHeader is the default request header carrying the idempotency key.
const KeyHeader = "Idempotency-Key"

// ReplayedHeader is the header the server package sets, to "true", on a
// response replayed from its store of keys (Stripe's name).
const ReplayedHeader = "Idempotent-Replayed"

// ReplayHeaders are the response headers by which servers mark an answer
// replayed from their store of keys.
var ReplayHeaders = []string{ReplayedHeader, "Idempotency-Replayed", "X-Idempotent-Replayed"}

// Replayed reports whether h carries any replay header set to true.
func Replayed(h http.Header) bool {
	for _, name := range ReplayHeaders {
		// h[name] is h.Get(name): the names are canonical already, and
		// Get would make each so again, on every answer.
		if v := h[name]; len(v) > 0 && strings.EqualFold(strings.TrimSpace(v[0]), "true") {
			return true
		}
	}
	return false
}

// MaxKeyLength is the default longest key a server accepts, in bytes of the
// unquoted key (Stripe's limit).
const MaxKeyLength = 255

// Errors from ParseKey.
var (
	ErrKeyMissing = errors.New("idempotency key missing")
	ErrKeyInvalid = errors.New("idempotency key invalid")
)

// ParseKey reads an Idempotency-Key header value written either as a bare
// token (what Stripe and most middlewares expect) or as an RFC 8941 sf-string
// (what the IETF draft specifies). Both forms of one key give the same key.
func ParseKey(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", ErrKeyMissing
	}
	if v[0] != '"' {
		for i := 0; i < len(v); i++ {
			if !isTChar(v[i]) {
				return "", fmt.Errorf("%w: byte %q at %d is not allowed in a token; quote the key as an sf-string to use it", ErrKeyInvalid, v[i], i)
			}
		}
		return v, nil
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", fmt.Errorf("%w: a backslash in an sf-string may only escape \" or \\", ErrKeyInvalid)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%w: unexpected %q after the closing quote", ErrKeyInvalid, v[i+1:])
			}
			if b.Len() == 0 {
				return "", ErrKeyMissing
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: byte %#x is not allowed in an sf-string", ErrKeyInvalid, c)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("%w: the sf-string has no closing quote", ErrKeyInvalid)
}

// FormatKey writes key as a header value: a bare token, or an RFC 8941
// sf-string when quoted is true.
func FormatKey(key string, quoted bool) string {
	if !quoted {
		return key
	}
	var b strings.Builder
	b.Grow(len(key) + 2)
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if key[i] == '"' || key[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}

// isTChar reports whether c is an RFC 9110 tchar. It is a lookup in a
// bit set, inlined into its loops: every name of every answer is checked
// (dropSecrets), and a switch with a search of the punctuation was a call
// and a few dozen instructions per byte.
func isTChar(c byte) bool { return tchars[c>>6]&(1<<(c&63)) != 0 }

// tchars is the set of tchars, bit c&63 of word c>>6 for byte c.
var tchars = func() (set [4]uint64) {
	for c := 0; c < 256; c++ {
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", byte(c)) >= 0 {
			set[c>>6] |= 1 << (c & 63)
		}
	}
	return set
}()

// Status states in the status endpoint's answers.
const (
	StateProcessing = "processing"
	StateCompleted  = "completed"
	StateNotFound   = "not_found"
)

// Status is the status endpoint's JSON body:
//
//	{"key":"…","state":"processing"|"completed"|"not_found",
//	 "response":{"status":201,"header":{"Content-Type":["application/json"]},"body":"…"}}
//
// The response is present when the state is completed. Its body is the
// stored body as a string; when that body is not valid UTF-8 it is base64
// and "body_encoding" is "base64". A not_found answer comes with HTTP 404.
type Status struct {
	Key      string    `json:"key"`
	State    string    `json:"state"`
	Response *Response `json:"response,omitempty"`
}

// Response is a stored response as the status endpoint carries it.
type Response struct {
	Status       int         `json:"status"`
	Header       http.Header `json:"header,omitempty"`
	Body         string      `json:"body"`
	BodyEncoding string      `json:"body_encoding,omitempty"`
}

// NewResponse encodes a stored response for the status endpoint.
func NewResponse(status int, h http.Header, body []byte) *Response {
	r := &Response{Status: status, Header: h}
	if utf8.Valid(body) {
		r.Body = string(body)
	} else {
		r.Body, r.BodyEncoding = base64.StdEncoding.EncodeToString(body), "base64"
	}
	return r
}

// ErrBadStatus is returned for a status answer that does not parse or does
// not follow the expected shape.
var ErrBadStatus = errors.New("the status answer does not have the expected shape")

// DecodeStatus reads a status endpoint's answer. httpStatus is the HTTP
// status of the answer; key is the key that was asked about. Only a 200
// with processing or completed, or a 404 with not_found, is accepted;
// anything else is an error, so that a broken status endpoint is never read
// as "not found".
func DecodeStatus(httpStatus int, body []byte, key string) (Status, []byte, error) {
	var s Status
	if err := json.Unmarshal(body, &s); err != nil {
		return Status{}, nil, fmt.Errorf("%w: HTTP %d with a body that is not JSON: %v", ErrBadStatus, httpStatus, err)
	}
	if s.Key != "" && s.Key != key {
		return Status{}, nil, fmt.Errorf("%w: asked about key %q, the answer is about %q", ErrBadStatus, key, s.Key)
	}
	switch {
	case s.State == StateNotFound && httpStatus == http.StatusNotFound:
		return s, nil, nil
	case s.State == StateProcessing && httpStatus == http.StatusOK:
		return s, nil, nil
	case s.State == StateCompleted && httpStatus == http.StatusOK:
		if s.Response == nil || s.Response.Status < 100 || s.Response.Status > 599 {
			return Status{}, nil, fmt.Errorf("%w: completed without a valid response status", ErrBadStatus)
		}
		body := []byte(s.Response.Body)
		switch s.Response.BodyEncoding {
		case "":
		case "base64":
			b, err := base64.StdEncoding.DecodeString(s.Response.Body)
			if err != nil {
				return Status{}, nil, fmt.Errorf("%w: response body is not valid base64: %v", ErrBadStatus, err)
			}
			body = b
		default:
			return Status{}, nil, fmt.Errorf("%w: unknown body_encoding %q", ErrBadStatus, s.Response.BodyEncoding)
		}
		return s, body, nil
	}
	switch {
	case s.State == "":
		return Status{}, nil, fmt.Errorf(`%w: HTTP %d without a "state" field; want {"key":…,"state":"processing"|"completed"|"not_found"}`, ErrBadStatus, httpStatus)
	case s.State != StateProcessing && s.State != StateCompleted && s.State != StateNotFound:
		return Status{}, nil, fmt.Errorf(`%w: HTTP %d with "state" %q; want "processing", "completed" or "not_found"`, ErrBadStatus, httpStatus, s.State)
	case s.State == StateNotFound:
		return Status{}, nil, fmt.Errorf(`%w: "state" "not_found" comes with HTTP 404, not %d`, ErrBadStatus, httpStatus)
	}
	return Status{}, nil, fmt.Errorf(`%w: "state" %q comes with HTTP 200, not %d`, ErrBadStatus, s.State, httpStatus)
}

// Problem types (RFC 9457) of the server package's errors. Clients
// recognise a reused key by ProblemKeyReused whatever the status code.
const (
	ProblemKeyMissing    = "urn:idem:problem:key-missing"
	ProblemKeyInvalid    = "urn:idem:problem:key-invalid"
	ProblemInProgress    = "urn:idem:problem:in-progress"
	ProblemKeyReused     = "urn:idem:problem:key-reused"
	ProblemBodyTooLarge  = "urn:idem:problem:body-too-large"
	ProblemStoreFailed   = "urn:idem:problem:store-unavailable"
	ProblemUnstorable    = "urn:idem:problem:request-unstorable"
	ProblemContentType   = "application/problem+json"
	problemContentPrefix = "application/problem+json"
)

// Problem is an RFC 9457 problem details object.
type Problem struct {
	Type   string `json:"type,omitempty"`
	Title  string `json:"title,omitempty"`
	Status int    `json:"status,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Key is the idempotency key the problem is about, when there is one.
	Key string `json:"key,omitempty"`
}

// ParseProblem reads an application/problem+json body. ok is false when the
// content type is not problem+json or the body does not parse.
func ParseProblem(contentType string, body []byte) (p Problem, ok bool) {
	// ASCII only: a Unicode case fold would accept "applİcation/…".
	ct := strings.TrimLeft(contentType, " \t")
	n := len(problemContentPrefix)
	if len(ct) < n || !asciiEqualFold(ct[:n], problemContentPrefix) {
		return Problem{}, false
	}
	if rest := ct[n:]; rest != "" && rest[0] != ';' && rest[0] != ' ' && rest[0] != '\t' {
		return Problem{}, false // application/problem+jsonx is another type
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return Problem{}, false
	}
	return p, true
}

func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
