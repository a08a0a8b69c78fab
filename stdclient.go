package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idem/internal/wire"
)

// The standard client: operations sent through net/http's own API, so
// that a vendor SDK or a generated client, which takes an *http.Client or
// an http.RoundTripper, gets idem's promise without being rewritten.
//
// The mechanism is a RoundTripper (Client.RoundTripper); StandardClient
// wraps it in an *http.Client. A RoundTripper composes with whatever an
// SDK accepts (a client, a transport, a client whose transport it wraps
// itself), and it sees each request after net/http's client has done its
// part (cookies, redirects, Timeout), which is where an operation can be
// journaled as the exact bytes that go on the wire.

// ErrNoResponse: the operation is settled, but the journal holds no answer
// of the server to return as an *http.Response: an operator settled it
// with Reconcile. Lookup shows the note the operator left.
var ErrNoResponse = errors.New("idem: the operation was settled without a server response")

// namedOp is the operation a request's context names.
type namedOp struct{ scope, id string }

type namedOpKey struct{}

// opContext is a context that names an operation: the context and the
// name in one allocation, where context.WithValue takes two.
type opContext struct {
	context.Context
	op namedOp
}

func (c *opContext) Value(key any) any {
	if _, ok := key.(namedOpKey); ok {
		return c // a pointer: no allocation to return it
	}
	return c.Context.Value(key)
}

// operationOf returns the operation ctx names, if any.
func operationOf(ctx context.Context) (namedOp, bool) {
	if c, ok := ctx.Value(namedOpKey{}).(*opContext); ok {
		return c.op, true
	}
	return namedOp{}, false
}

// WithOperation returns a copy of ctx that names the operation id: a
// request sent with it through the client's RoundTripper or
// StandardClient is that operation, in the client's Config.Scope. See
// Client.RoundTripper.
func WithOperation(ctx context.Context, id string) context.Context {
	return WithScopedOperation(ctx, "", id)
}

// WithScopedOperation is WithOperation for the operation id of the given
// scope (tenant); an empty scope is the client's Config.Scope.
func WithScopedOperation(ctx context.Context, scope, id string) context.Context {
	if ctx == nil {
		panic("idem: WithScopedOperation of a nil context") // as context.WithValue
	}
	return &opContext{Context: ctx, op: namedOp{scope: scope, id: id}}
}

// A TransportOption changes how Client.RoundTripper and
// Client.StandardClient treat requests.
type TransportOption func(*transportOptions)

type transportOptions struct {
	refuseUnnamed bool
}

// RefuseUnnamedWrites makes the RoundTripper refuse, with ErrInvalidOp and
// before anything is sent, a request whose method may change state (any
// method but GET, HEAD, OPTIONS and TRACE) and whose context names no
// operation: for an application in which every write must be an
// operation. Without it such a request passes through untouched.
func RefuseUnnamedWrites() TransportOption {
	return func(o *transportOptions) { o.refuseUnnamed = true }
}

// RoundTripper returns an http.RoundTripper that sends each request whose
// context names an operation (WithOperation, WithScopedOperation) as that
// operation, exactly as Do would: journaled before it is sent, with its
// key in the journaled wire form, retried with the same key, settled by a
// status check when its outcome is unknown, and taken up by Resume after a
// crash, which sends the journaled bytes again.
//
// The request: its body is read to its end and closed before anything is
// journaled (GetBody is not needed: every attempt sends the journaled
// bytes); the request's context ending closes it, as net/http's transport
// does, and ends the call. A body longer than the journal's limit (its MaxBodySize method,
// else DefaultMaxBodySize) is ErrBodyTooLarge, one that cannot be read is
// ErrInvalidOp; a GET, HEAD, OPTIONS or TRACE, a URL of another origin
// than Config.BaseURL's (when set), or a Host other than the URL's is
// ErrInvalidOp: nothing is journaled or sent. The method, URL, headers
// and body are journaled, except for:
//
//   - credentials (Authorization, Proxy-Authorization, Cookie and
//     Config.SecretHeaders): never journaled. They are added to every
//     request of this call for the operation that goes to the request's
//     origin (attempts, and status checks when the status endpoint is on
//     that origin), after Config.Authorize, which they override; they
//     never leave the request's origin: a status check elsewhere carries
//     Config.Authorize's credentials only, as Authorize sees where each
//     request goes. A Resume, or a later
//     call without them, has Config.Authorize's: set it when operations
//     must be finished after a restart;
//   - a key the request carries (Config.KeyHeader, Idempotency-Key,
//     X-Idempotency-Key), as SDKs such as stripe-go set one per call: it is
//     dropped, and the operation's journaled key goes on every attempt.
//     The operation's key is minted once, journaled before the first send,
//     and outlives the process; an SDK's key is new with each SDK call and
//     each restart, so adopting it would give one operation two keys;
//   - hop-by-hop headers, which the transport manages.
//
// The fingerprint is the method, URL and body: the same operation ID with
// another of them is ErrFingerprintMismatch. Credentials are not part of
// it: within one scope an ID names one operation whoever calls it, so a
// client that calls for several principals names the principal (an
// account or user ID, never a token: the scope is journaled) in the scope
// with WithScopedOperation.
//
// The answer follows net/http's conventions. A definitive answer (2xx, a
// rejection such as a 4xx, a replay) is an *http.Response with a nil
// error, whatever its status, as a transport returns it: the server's
// status and journaled headers (Set-Cookie and secret headers are never
// journaled, so a cookie jar does not see them), the Idempotent-Replayed
// mark when the server replayed it, and a body read from memory, which
// Close need not drain. ResultOf gives the idem Result behind it. Anything
// else is an error, which http.Client wraps in a *url.Error that errors.Is
// sees through: ErrOutcomeUnknown and ErrNotSent (the operation stays
// journaled; Resume, or the same request again, finishes it), ErrCanceled,
// ErrNeedsReconciliation, ErrFingerprintMismatch, ErrNoResponse, and the
// context's error (with the operation's sentinel) when the request's
// context ends or its deprecated Cancel channel is closed. A response the
// classifier does not take as definitive (a 401, a 5xx) is retried, not
// returned: when retries end, the error says what is known.
//
// A request whose context names no operation is passed through untouched
// to Config.HTTPClient's transport: no key, no journal, no Authorize, no
// AttemptTimeout (unless RefuseUnnamedWrites). So is a GET or HEAD that
// net/http's client makes to follow a redirect (301, 302, 303) of an
// operation's answer, except that it goes to another origin without the
// call's credentials (Cookie aside, which the jar chooses). A 307 or 308 within the request's origin is
// followed inside the operation, with its key; one to another origin is
// the operation's answer, and the RoundTripper refuses to send the write
// there if an http.Client tries.
//
// CloseIdleConnections closes the client's idle connections.
func (c *Client) RoundTripper(opts ...TransportOption) http.RoundTripper {
	t := &roundTripper{c: c, maxBody: DefaultMaxBodySize}
	for _, o := range opts {
		o(&t.opts)
	}
	if m, ok := c.journal.(interface{ MaxBodySize() int }); ok && m.MaxBodySize() > 0 {
		t.maxBody = m.MaxBodySize()
	}
	return t
}

// StandardClient returns an *http.Client whose transport is
// c.RoundTripper(opts...), for code that takes a client rather than a
// transport. It follows redirects as http.Client does, except that the
// redirect of an operation that would re-send its write (307, 308; those
// within the origin are followed inside the operation) is returned as the
// answer. It has no Timeout (each attempt is bounded by
// Config.AttemptTimeout; bound a call with its context: when an
// http.Client's Timeout fires, net/http replaces the transport's error by
// its text, and errors.Is no longer sees ErrOutcomeUnknown) and no Jar
// (Config.HTTPClient's Jar applies to the operation's attempts).
func (c *Client) StandardClient(opts ...TransportOption) *http.Client {
	return &http.Client{Transport: c.RoundTripper(opts...), CheckRedirect: standardRedirect}
}

// standardRedirect is net/http's default policy (at most 10 redirects),
// except for an operation's write.
func standardRedirect(req *http.Request, via []*http.Request) error {
	if _, named := operationOf(req.Context()); named && !safeMethod(req.Method) {
		return http.ErrUseLastResponse
	}
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	return nil
}

type roundTripper struct {
	c       *Client
	opts    transportOptions
	maxBody int
	// lastURL is the last request URL checked (its origin against
	// BaseURL's too), and the string journaled for it: an SDK sends most
	// requests to a few URLs (as Client.resolve).
	lastURL atomic.Pointer[checkedURL]
	// lastHeader is the last header journaled, checked, which no one
	// changes (split).
	lastHeader atomic.Pointer[http.Header]
}

// lastHeader is h, for roundTripper.lastHeader.
func lastHeader(h http.Header) *http.Header { return &h }

type checkedURL struct {
	u      url.URL
	target string
}

// target is req's URL checked as the URL an operation goes to, and as it
// is journaled.
func (t *roundTripper) target(req *http.Request, op namedOp) (string, error) {
	if last := t.lastURL.Load(); last != nil && last.u == *req.URL {
		return last.target, nil
	}
	u := *req.URL
	if b := t.c.base; b != nil {
		if !sameOrigin(&u, b) {
			return "", invalidOp("%s %s: operation %q goes to another origin than Config.BaseURL (%s://%s); a client's operations, credentials and Resume belong to its BaseURL: use a client for that API",
				req.Method, redact(req), op.id, b.Scheme, b.Host)
		}
		// Spelled as BaseURL is, so that Resume knows it as its origin's.
		u.Scheme, u.Host = b.Scheme, b.Host
	}
	target, err := checkURL(redact(req), &u)
	if err == nil {
		t.lastURL.Store(&checkedURL{u: *req.URL, target: target})
	}
	return target, err
}

// RoundTrip sends req as its context's operation, or passes it through.
func (t *roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	op, named := operationOf(req.Context())
	switch {
	case !named && t.opts.refuseUnnamed && !safeMethod(req.Method):
		closeBody(req)
		return nil, invalidOp("%s %s: its context names no operation, and this transport refuses writes that are not operations (RefuseUnnamedWrites); name one with idem.WithOperation", req.Method, redact(req))
	case !named:
		return t.c.rawTransport().RoundTrip(req)
	case req.Response != nil && safeMethod(req.Method):
		// net/http's client follows a 301, 302 or 303 of the operation's
		// answer with a GET: the operation is settled, this is a read.
		return t.c.rawTransport().RoundTrip(t.withoutCredentialsElsewhere(req))
	case req.Response != nil:
		closeBody(req)
		return nil, fmt.Errorf("idem: operation %q answered HTTP %d, a redirect to %s, another origin: its write is not sent there (a write and its credentials never leave the request's origin); the redirect is the operation's answer",
			op.id, req.Response.StatusCode, redact(req))
	}
	// The response, and the call's credentials until then: one
	// allocation.
	r := &resultResponse{}
	p, err := t.operation(req, op, &r.creds)
	if err != nil {
		return nil, err
	}
	ctx, stop := cancelWith(req)
	defer stop()
	if len(r.creds.header) > 0 {
		r.creds.Context, r.creds.origin = ctx, req.URL
		ctx = &r.creds
	}
	res, err := t.c.do(ctx, p)
	if err != nil && (res == nil || !errors.Is(err, ErrRejected)) {
		return nil, err
	}
	if res.StatusCode == 0 {
		return nil, fmt.Errorf("%w: operation %s/%s (key %s) is %s", ErrNoResponse, res.Scope, res.ID, res.Key, res.State)
	}
	return r.response(req, res), nil
}

// withoutCredentialsElsewhere is req without the call's credentials when
// it follows a redirect to another origin than the first request's:
// net/http drops Authorization and Cookie only for another host name (not
// another port or scheme) and Config.SecretHeaders never. Cookie stays, as
// net/http and the cookie jar choose it for the destination.
func (t *roundTripper) withoutCredentialsElsewhere(req *http.Request) *http.Request {
	first := req
	for first.Response != nil && first.Response.Request != nil {
		first = first.Response.Request
	}
	if first.URL == nil || req.URL == nil ||
		(strings.EqualFold(first.URL.Scheme, req.URL.Scheme) && strings.EqualFold(first.URL.Host, req.URL.Host)) {
		return req
	}
	var r *http.Request
	for name := range req.Header {
		canon := http.CanonicalHeaderKey(name)
		if canon == "Cookie" || !t.c.secretHeader(canon) {
			continue
		}
		if r == nil {
			r = req.Clone(req.Context()) // a RoundTripper must not change its request
		}
		delete(r.Header, name)
	}
	if r == nil {
		return req
	}
	return r
}

// sameOrigin reports whether a and b are one origin (RFC 6454): scheme
// and host alike whatever their case, a port its scheme's default being
// no port, as an SDK may spell BaseURL's origin with ":443".
func sameOrigin(a, b *url.URL) bool {
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Hostname(), b.Hostname()) &&
		effectivePort(a) == effectivePort(b)
}

func effectivePort(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if strings.EqualFold(u.Scheme, "https") {
		return "443"
	}
	return "80"
}

// CloseIdleConnections closes the client's idle connections, as
// http.Client.CloseIdleConnections expects of a transport.
func (t *roundTripper) CloseIdleConnections() { t.c.http.CloseIdleConnections() }

// operation reads req into the operation it stands for, validated as Do
// validates an Op, and into creds the credentials it carries for this
// call. It closes the body.
func (t *roundTripper) operation(req *http.Request, op namedOp, creds *callCredentials) (prepared, error) {
	fail := func(err error) (prepared, error) {
		closeBody(req)
		return prepared{}, err
	}
	if op.id == "" {
		return fail(invalidOp("%s %s: the context names an operation with an empty ID; give idem.WithOperation a stable ID, such as \"checkout/cart-42\"", req.Method, redact(req)))
	}
	if safeMethod(req.Method) {
		return fail(invalidOp("%s %s is a read, but its context names operation %q: an operation is a write; send reads with a context that names no operation", req.Method, redact(req), op.id))
	}
	if req.URL == nil || !req.URL.IsAbs() {
		return fail(invalidOp("%s: the request's URL is not absolute", req.Method))
	}
	if req.Host != "" && !strings.EqualFold(req.Host, req.URL.Host) {
		return fail(invalidOp("%s %s: Request.Host %q differs from the URL's host; the journaled request is its URL, so set the host there", req.Method, redact(req), req.Host))
	}
	target, err := t.target(req, op)
	if err != nil {
		return fail(err)
	}
	header, checked := t.split(req.Header, creds)
	// The journaled header is checked as Op.Header is (prepareAt); the
	// call's credentials likewise, before anything is journaled.
	for _, c := range creds.header {
		if err := checkHeader("the request's credential header", c.name, c.values); err != nil {
			return fail(err)
		}
	}
	body, err := t.readBody(req)
	if err != nil {
		return prepared{}, err
	}
	// The header is split's, made for this call or checked for one
	// before: prepareAt need not copy it.
	use := ownHeader
	if checked {
		use = checkedHeader
	}
	p, err := t.c.prepareAt(Op{Scope: op.scope, ID: op.id, Method: req.Method, Header: header, Body: body}, target, use)
	if err != nil {
		return prepared{}, err
	}
	if !checked {
		t.lastHeader.Store(lastHeader(header))
	}
	// Both are this call's own, values and bytes: a MemoryJournal keeps
	// them without a copy.
	p.ownHeader, p.ownBody = true, true
	return p, nil
}

// split separates what is journaled from the request's headers and the
// credentials that go with this call only, which it adds to creds. The journaled header is the
// client's own, values and all (one array for them), which a
// MemoryJournal keeps as it is: the caller may change the request's once
// the call returns. The credentials share the request's values, which a
// RoundTripper may read until it returns and must not change.
//
// When the request's journaled headers are those of the header the
// RoundTripper journaled last (an SDK sends the same Content-Type,
// User-Agent and API version on every call), that header is journaled
// again, checked already (checked is true): one map shared, read-only, by
// the records of those calls, instead of a map and its values made and
// checked for each.
func (t *roundTripper) split(h http.Header, creds *callCredentials) (journaled http.Header, checked bool) {
	var last http.Header
	if p := t.lastHeader.Load(); p != nil {
		last = *p
	}
	same := last != nil
	n, kept := 0, 0
	for name, values := range h {
		canon := http.CanonicalHeaderKey(name)
		switch {
		case t.c.secretHeader(canon):
			creds.add(canon, values, h)
		case canon == t.c.keyHeader, slices.Contains(callerKeyHeaders, canon), slices.Contains(hopByHop, canon):
		default:
			n += len(values)
			kept++
			if same {
				// One spelling per name (as canon), the same values.
				v, ok := last[canon]
				same = ok && name == canon && slices.Equal(v, values)
			}
		}
	}
	if same && kept == len(last) {
		return last, true
	}
	all := make([]string, 0, n)
	journaled = make(http.Header, kept)
	for name, values := range h {
		canon := http.CanonicalHeaderKey(name)
		switch {
		case t.c.secretHeader(canon), canon == t.c.keyHeader, slices.Contains(callerKeyHeaders, canon), slices.Contains(hopByHop, canon):
		case journaled[canon] != nil:
			// Every spelling's values, in one slice of its own.
			journaled[canon] = spellings(h, canon, true, values)
		default:
			start := len(all)
			all = append(all, spellings(h, canon, false, values)...)
			journaled[canon] = all[start:len(all):len(all)]
		}
	}
	return journaled, false
}

// spellings is the values of the header canon: values, the only
// spelling's, or when h has several spellings of it (req.Header["x-trace"]
// beside "X-Trace") all of theirs in the order of the names, as the server
// reads the lines net/http writes for them.
func spellings(h http.Header, canon string, several bool, values []string) []string {
	if !several {
		return values
	}
	var names []string
	for name := range h {
		if http.CanonicalHeaderKey(name) == canon {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var all []string
	for _, name := range names {
		all = append(all, h[name]...)
	}
	return all
}

// callerKeyHeaders are the headers in which SDKs put keys of their own.
var callerKeyHeaders = []string{wire.KeyHeader, "X-Idempotency-Key"}

// hopByHop are the headers of one connection (RFC 9110, 7.6.1), and those
// the transport writes itself.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding",
	"Upgrade", "Content-Length", "Host"}

// readBody reads the body to its end, at most maxBody bytes, and closes it.
func (t *roundTripper) readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		if req.ContentLength > 0 { // net/http's transport refuses it too
			return nil, invalidOp("%s %s: ContentLength is %d but the request has no body; nothing was journaled or sent", req.Method, redact(req), req.ContentLength)
		}
		return nil, nil
	}
	defer req.Body.Close()
	tooLarge := func(n string) error {
		return fmt.Errorf("%w: %s %s: the body is %s bytes, the journal's limit is %d; nothing was journaled or sent: send large payloads by reference, or raise the journal's limit (SQLiteMaxBodySize)",
			ErrBodyTooLarge, req.Method, redact(req), n, t.maxBody)
	}
	if req.ContentLength > int64(t.maxBody) {
		return nil, tooLarge(strconv.FormatInt(req.ContentLength, 10))
	}
	// A read that blocks (a pipe whose writer waits) ends with the
	// request's context, as net/http's transport ends it: by closing the
	// body.
	ended := func() bool { return false }
	if req.Context().Done() != nil { // else it never ends: nothing to wait for
		stop := context.AfterFunc(req.Context(), func() { _ = req.Body.Close() })
		ended = func() bool { return !stop() }
	}
	body, err := readAll(req.Body, req.ContentLength, t.maxBody+1)
	canceled := ended() // and the AfterFunc unregistered, whatever err is
	switch {
	case err != nil && canceled:
		return nil, fmt.Errorf("%s %s: the request's context ended while its body was read: %w; nothing was journaled or sent", req.Method, redact(req), context.Cause(req.Context()))
	case err != nil:
		return nil, fmt.Errorf("%w: %s %s: reading the body: %w; nothing was journaled or sent", ErrInvalidOp, req.Method, redact(req), err)
	case len(body) > t.maxBody:
		return nil, tooLarge("more than " + strconv.Itoa(t.maxBody))
	case req.ContentLength > 0 && int64(len(body)) != req.ContentLength:
		return nil, invalidOp("%s %s: ContentLength is %d but the body has %d bytes; nothing was journaled or sent", req.Method, redact(req), req.ContentLength, len(body))
	}
	return body, nil
}

// readAll is io.ReadAll of at most limit bytes, with room for size bytes
// and one more from the start when the size is known: the body is read
// into one allocation instead of a doubling series of them. A reader that
// returns nothing and no error 100 times in a row (bufio's bound) is
// io.ErrNoProgress, rather than read for as long as it does.
func readAll(r io.Reader, size int64, limit int) ([]byte, error) {
	n := int64(512)
	if size > 0 && size < int64(limit) {
		n = size + 1 // +1: the read that sees the end
	}
	b := make([]byte, 0, n)
	for empty := 0; ; {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):min(cap(b), limit)])
		b = b[:len(b)+n]
		if err == io.EOF || len(b) >= limit {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if empty++; n > 0 {
			empty = 0
		} else if empty >= 100 {
			return b, io.ErrNoProgress
		}
	}
}

// cancelWith returns the request's context, ended also when its
// deprecated Cancel channel is closed, as net/http's transport honours it.
func cancelWith(req *http.Request) (context.Context, func()) {
	ctx := req.Context()
	if req.Cancel == nil { //nolint:staticcheck // honoured as net/http documents it
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		select {
		case <-req.Cancel: //nolint:staticcheck // see above
			cancel()
		case <-done:
		}
	}()
	return ctx, func() { close(done); cancel() }
}

// response is res as net/http's transport would return it, made in r.
// Its Header is res.Header, which is this call's own (a Result is its
// caller's: the journal keeps a copy, and calls that share one attempt
// each get a copy of its Result), unless it must differ from the
// server's: a body cut short of its Content-Length, a replay whose mark
// the header lacks.
func (r *resultResponse) response(req *http.Request, res *Result) *http.Response {
	h := res.Header
	mark := res.Replayed && !wire.Replayed(h)
	if mark || res.BodyCut || !contentLengthIs(h, len(res.Body)) {
		h = h.Clone()
		h.Del("Content-Length") // the body was cut (Config.MaxResponseBytes)
		if mark {
			if h == nil {
				h = http.Header{}
			}
			h.Set(wire.ReplayedHeader, "true")
		}
	}
	if h == nil {
		h = http.Header{}
	}
	r.body.Reset(res.Body)
	r.body.res = res
	r.resp = http.Response{
		Status:     statusLine(res.StatusCode),
		StatusCode: res.StatusCode, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        h,
		Body:          &r.body,
		ContentLength: int64(len(res.Body)),
		Request:       req,
	}
	if res.BodyCut {
		r.resp.ContentLength = -1 // unknown: the whole answer was longer
	}
	return &r.resp
}

// resultResponse is a response and its body, allocated together, with
// the call's credentials, which it needs until the response is made.
type resultResponse struct {
	resp  http.Response
	body  resultBody
	creds callCredentials
}

// contentLengthIs reports whether h's Content-Length is n or absent.
func contentLengthIs(h http.Header, n int) bool {
	v, ok := h["Content-Length"]
	if !ok {
		return true
	}
	if len(v) != 1 {
		return false
	}
	got, err := strconv.ParseInt(v[0], 10, 64)
	return err == nil && got == int64(n)
}

// statusLines are net/http's status lines ("201 Created") of the codes it
// knows, made once instead of on each response, indexed by code.
var statusLines = func() (lines [600]string) {
	for code := 100; code < len(lines); code++ {
		if text := http.StatusText(code); text != "" {
			lines[code] = strconv.Itoa(code) + " " + text
		}
	}
	return lines
}()

func statusLine(code int) string {
	if code >= 0 && code < len(statusLines) && statusLines[code] != "" {
		return statusLines[code]
	}
	return strconv.Itoa(code) + " " + http.StatusText(code)
}

// resultBody is the body of a response the RoundTripper returns: the
// journaled answer, and the Result it belongs to.
type resultBody struct {
	bytes.Reader
	res *Result
}

// errBodyCut ends the body of an answer cut at Config.MaxResponseBytes:
// a reader that knows nothing of idem must not take the bytes kept for
// the whole answer, and net/http reports a body that ends early so.
var errBodyCut = fmt.Errorf("idem: the response body was cut at Config.MaxResponseBytes (Result.BodyCut): %w", io.ErrUnexpectedEOF)

func (b *resultBody) Read(p []byte) (int, error) {
	n, err := b.Reader.Read(p)
	if err == io.EOF && b.res != nil && b.res.BodyCut {
		err = errBodyCut
	}
	return n, err
}

// WriteTo is bytes.Reader's (io.Copy uses it), with Read's end.
func (b *resultBody) WriteTo(w io.Writer) (int64, error) {
	n, err := b.Reader.WriteTo(w)
	if err == nil && b.res != nil && b.res.BodyCut {
		err = errBodyCut
	}
	return n, err
}

func (*resultBody) Close() error { return nil }

// ResultOf returns the Result behind a response that Client.RoundTripper
// or Client.StandardClient returned for an operation (its key, whether
// the server replayed it, whether it came from the journal without being
// sent), or false for any other response, or one whose Body was replaced.
// The response's Header is the Result's, one map, except when it had to
// differ from the server's (a body cut at Config.MaxResponseBytes, short
// of its Content-Length); neither is the journal's.
func ResultOf(resp *http.Response) (*Result, bool) {
	if resp == nil {
		return nil, false
	}
	b, ok := resp.Body.(*resultBody)
	if !ok {
		return nil, false
	}
	return b.res, true
}

// safeMethod reports whether a method is a read (RFC 9110, 9.2.1).
func safeMethod(m string) bool {
	switch m {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// redact is the request's URL for an error: without its query, which may
// carry personal data or a token, nor its userinfo.
func redact(req *http.Request) string {
	if req.URL == nil {
		return ""
	}
	return redactURL(req.URL)
}

func redactURL(u *url.URL) string {
	v := *u
	v.User, v.RawQuery, v.ForceQuery = nil, "", false
	return v.String()
}

// redactError is err, the error of an HTTP client's Do, with the URL of
// its *url.Error (net/http's "Post \"…\": EOF") redacted as redact does.
// A transport's error becomes an attempt's or a status check's reason,
// which goes to the logs, the journal's history, OnTransition, Hooks and
// the error Do returns: none of them may carry a token of the URL's query.
// The journaled request keeps the whole URL (it is sent again); the error
// is still a *url.Error, wrapping the same cause.
func redactError(err error) error {
	ue, ok := err.(*url.Error)
	if !ok {
		return err
	}
	redacted := *ue
	redacted.URL = redactString(ue.URL)
	switch {
	case ue.Err == nil:
	case ue.Op == "parse": // url.Parse's own error
		if msg := parseReason(ue.Err); msg != ue.Err.Error() {
			redacted.Err = &redactedError{msg: msg, err: ue.Err}
		}
	default:
		msg := ue.Err.Error()
		if loc, ok := unparsableLocation(msg); ok {
			// net/http quotes a Location it could not parse, whole: a
			// header value, which may hold spaces and quotes, so no
			// pattern finds where its query or userinfo ends in the text.
			// The value is redacted as a whole; one that does not parse
			// keeps nothing of what follows its host, '?' or '@' in it
			// or not.
			shown, reason := redactString(loc), "not a valid URL"
			if _, perr := url.Parse(loc); perr != nil {
				shown, reason = redactUnparsable(loc), parseReason(perr)
			}
			redacted.Err = &redactedError{msg: fmt.Sprintf("%s%q: %s", locationPrefix, shown, reason), err: ue.Err}
		} else if urlSecretsInText.MatchString(msg) {
			// Another URL quoted in a transport's text, which net/http's
			// own errors do not do: taken out as far as a pattern can.
			redacted.Err = &redactedError{msg: urlSecretsInText.ReplaceAllString(msg, ""), err: ue.Err}
		}
	}
	if redacted.URL == ue.URL && redacted.Err == ue.Err {
		return err
	}
	return &redacted
}

// locationPrefix begins net/http's error for a Location it could not
// parse: "failed to parse Location header %q: %v".
const locationPrefix = "failed to parse Location header "

// unparsableLocation is the Location that net/http's error msg quotes, if
// msg is that error: %q is undone exactly, not found by a pattern.
func unparsableLocation(msg string) (string, bool) {
	rest, ok := strings.CutPrefix(msg, locationPrefix)
	if !ok {
		return "", false
	}
	q, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return "", false
	}
	loc, err := strconv.Unquote(q)
	return loc, err == nil
}

// urlSecretsInText matches what redact takes out of a URL, where a URL is
// quoted in an error's text: a query, and userinfo.
var urlSecretsInText = regexp.MustCompile(`\?[^"\s]+|[^/?#@"\s]*@`)

// redactedError is err with the text msg: errors.Is and As still see err.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redactString is redact for a URL in a string; one that does not parse
// is redactUnparsable's.
func redactString(s string) string {
	if !strings.ContainsAny(s, "?@") {
		return s // no query nor userinfo however it is read: no parsing, no copy
	}
	u, err := url.Parse(s)
	if err != nil {
		return redactUnparsable(s)
	}
	return redactURL(u)
}

// redactUnparsable is what may be quoted of s, a URL that does not parse,
// whose query and userinfo cannot be told from the rest: its scheme and
// host, when it has no userinfo and they parse by themselves, else its
// scheme, and "…" for what was left out.
func redactUnparsable(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok || !validScheme(scheme) {
		return "…"
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 && !strings.Contains(s, "@") {
		// A password may hold '/', '?' or '#' unescaped, and then what
		// precedes it reads as a host: one is taken only where there is
		// no '@' at all.
		if o, err := url.Parse(scheme + "://" + rest[:i]); err == nil && o.Host != "" && o.User == nil {
			return scheme + "://" + o.Host + "/…"
		}
	}
	return scheme + "://…"
}

// validScheme is RFC 3986's scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ).
func validScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}

// parseReason is why url.Parse refused a URL (err, its *url.Error or what
// that wraps), for an error that quotes the URL redacted: net/url quotes
// a part of the URL in some reasons, and only those that quote a few bytes
// of it (an escape, a host's character) are kept whole; "invalid port"
// quotes what follows a ':' of the authority, which a password holding a
// '/' becomes.
func parseReason(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		err = ue.Err
	}
	var (
		escape url.EscapeError
		host   url.InvalidHostError
	)
	switch msg := err.Error(); {
	case errors.As(err, &escape), errors.As(err, &host):
		return msg
	case strings.HasPrefix(msg, "invalid port "):
		return "invalid port after host"
	case strings.ContainsAny(msg, "\"'`"):
		return "not a valid URL"
	default:
		return msg
	}
}

// rawTransport is Config.HTTPClient's transport (or the default one), with
// nothing of idem's: for requests that are not operations.
func (c *Client) rawTransport() http.RoundTripper {
	return c.http.Transport.(authorizing).base
}

// callCredentials are the credentials a request gave the RoundTripper,
// which authorizing adds to every request of that call for its operation,
// after Config.Authorize. They are the call's context, the credentials
// and the room for the usual one or two of them, allocated with the
// response the call returns (resultResponse), where a header map in a
// context value took three allocations and the response a fourth.
type callCredentials struct {
	context.Context
	// origin is the request's URL: the credentials go to its origin only.
	origin *url.URL
	header []credential
	inline [2]credential
}

// A credential is a header's canonical name and its values, the
// request's (a RoundTripper may read them until it returns).
type credential struct {
	name   string
	values []string
}

type callCredentialsKey struct{}

func (c *callCredentials) Value(key any) any {
	if _, ok := key.(callCredentialsKey); ok {
		return c
	}
	return c.Context.Value(key)
}

// add adds the header canon, whose values under one of h's spellings are
// values.
func (c *callCredentials) add(canon string, values []string, h http.Header) {
	if c.header == nil {
		c.header = c.inline[:0]
	}
	for i := range c.header {
		if c.header[i].name == canon {
			c.header[i].values = spellings(h, canon, true, values)
			return
		}
	}
	c.header = append(c.header, credential{canon, values})
}

// credentialsOf returns the call's credentials that ctx carries, if any.
func credentialsOf(ctx context.Context) *callCredentials {
	c, _ := ctx.Value(callCredentialsKey{}).(*callCredentials)
	return c
}

// forURL returns the credentials for a request to u: none unless u is on
// the origin of the request that gave them.
func (c *callCredentials) forURL(u *url.URL) []credential {
	if c == nil || u == nil || c.origin == nil || !sameOrigin(u, c.origin) {
		return nil
	}
	return c.header
}

// withCredentials sets creds in h, in place of the headers of their names
// under whatever spelling h has them.
func withCredentials(h http.Header, creds []credential) {
	for name := range h {
		canon := http.CanonicalHeaderKey(name)
		for _, c := range creds {
			if c.name == canon {
				delete(h, name)
				break
			}
		}
	}
	for _, c := range creds {
		h[c.name] = c.values
	}
}

// canonicalOrigin is u with its origin in the one spelling every client
// of that origin journals it in, whatever spelling its BaseURL has, so
// that Resume finds a worker's operations by a prefix whichever worker
// journaled them: the scheme and the host in lower case (a zone of an
// IPv6 address kept as is, an interface name being case-sensitive), the
// scheme's default port dropped. The host is kept decoded, as url.URL
// holds it: String encodes it as Do journals it. u is not changed.
func canonicalOrigin(u *url.URL) *url.URL {
	host, port := u.Hostname(), u.Port()
	if i := strings.IndexByte(host, '%'); i >= 0 {
		host = strings.ToLower(host[:i]) + host[i:]
	} else {
		host = strings.ToLower(host)
	}
	scheme := strings.ToLower(u.Scheme)
	if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") {
		port = ""
	}
	if strings.IndexByte(host, ':') >= 0 {
		host = "[" + host + "]"
	}
	if port != "" {
		host += ":" + port
	}
	if scheme == u.Scheme && host == u.Host {
		return u
	}
	c := *u
	c.Scheme, c.Host = scheme, host
	return &c
}

// originPrefix is how every URL of u's origin begins as Do journals it
// ("https://api.example.com/"): its host encoded as url.URL.String
// encodes it.
func originPrefix(u *url.URL) string {
	return (&url.URL{Scheme: u.Scheme, Host: u.Host}).String() + "/"
}
