package idem

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/idemkit/idem/internal/wire"
)

// Op is one logical operation as the caller asks for it. Calling Do or
// Begin again with the same Scope and ID reuses the journaled key and, once
// the operation is settled, returns the journaled result without sending.
type Op struct {
	// Scope is the tenant or namespace the operation belongs to; keys are
	// minted per (Scope, ID). Defaults to Config.Scope.
	Scope string
	// ID is the caller's stable name for the logical operation, such as
	// "checkout/cart-42" or a tool-call ID; unique within Scope. Required.
	// It is journaled in clear: keep personal data out of it.
	ID string
	// Method defaults to POST.
	Method string
	// URL is absolute, or relative to Config.BaseURL. With BaseURL set,
	// an absolute URL must have BaseURL's origin (ErrInvalidOp otherwise):
	// a client's operations, credentials and Resume belong to its BaseURL.
	URL string
	// Header is sent with every attempt and journaled, its names made
	// canonical: the spellings of one name ("x-a", "X-A") are one header,
	// with the values of each spelling in turn, spellings in byte order
	// (as the standard client merges a request's). Credentials are
	// refused here (Authorization, Proxy-Authorization, Cookie, X-Api-Key,
	// X-Auth-Token, Api-Key and Config.SecretHeaders): add them with
	// Config.Authorize.
	Header http.Header
	// Body is sent byte for byte on every attempt.
	Body []byte
	// SignificantHeaders names headers of Header that are part of the
	// fingerprint, such as a Content-Type whose change changes the meaning.
	SignificantHeaders []string
}

// Result is a definitive answer: the server's response to the operation.
type Result struct {
	Key   string
	Scope string
	ID    string
	// State is StateSucceeded (2xx) or StateRejected (any other definitive
	// answer, such as a 4xx).
	State      State
	StatusCode int
	Header     http.Header
	Body       []byte
	// Replayed reports that the server answered from its store of keys
	// rather than executing the request.
	Replayed bool
	// Attempts is the number of attempts journaled for the operation: the
	// times the client sent it, replays made to check its status included.
	Attempts int
	// TransportResends is the number of times Go's transport sent an
	// attempt again by itself, after a reused connection died before any
	// reply; see RetryPolicy.MaxAttempts.
	TransportResends int
	// BodyCut reports that Body is not the whole answer: it was cut at
	// Config.MaxResponseBytes (the journal notes it in LastError). The
	// standard client's response then has no Content-Length, and reading
	// its body ends with an error matching io.ErrUnexpectedEOF after the
	// bytes kept, as net/http reports a body that ends early.
	BodyCut bool
	// Journaled reports that the answer came from the journal: the
	// operation had settled before this call, which sent nothing. An agent
	// runtime, say, can tell a tool call that ran now from one that ran
	// earlier.
	Journaled bool
}

// Succeeded reports whether the server answered 2xx.
func (r *Result) Succeeded() bool { return r.State == StateSucceeded }

// clone is a copy of r whose Header and Body are its own.
func (r *Result) clone() *Result {
	if r == nil {
		return nil
	}
	c := *r
	c.Header = r.Header.Clone()
	c.Body = slices.Clone(r.Body)
	return &c
}

func resultFrom(rec Record) *Result {
	r := &Result{Key: rec.Key, Scope: rec.Scope, ID: rec.ID, State: rec.State, Attempts: rec.Attempts,
		TransportResends: rec.TransportResends}
	if rec.Response != nil {
		r.StatusCode = rec.Response.StatusCode
		r.Header = rec.Response.Header
		r.Body = rec.Response.Body
		r.Replayed = rec.Response.Replayed
	}
	r.BodyCut = bodyCutIn(rec.LastError)
	return r
}

// The note settle journals in LastError when the answer's body was cut,
// last of its notes: "response body cut at N bytes (Config.MaxResponseBytes)".
const (
	bodyCutNote = "response body cut at "
	bodyCutEnd  = " (Config.MaxResponseBytes)"
)

// bodyCutIn reports whether a settled record's LastError notes the cut.
func bodyCutIn(lastError string) bool {
	if !strings.HasSuffix(lastError, bodyCutEnd) {
		return false
	}
	i := strings.LastIndex(lastError, bodyCutNote)
	return i == 0 || (i > 0 && strings.HasSuffix(lastError[:i], "; "))
}

// KeyKind chooses how keys are minted.
type KeyKind uint8

const (
	// KeyRandom mints a random UUIDv4. It is the default.
	KeyRandom KeyKind = iota
	// KeyTimeOrdered mints a UUIDv7, which sorts by creation time. The
	// journal's index of keys then grows at its end instead of at random
	// pages, so a commit of many writes touches fewer pages: 1.09-1.12x
	// the operations per second of KeyRandom on the SQLite journal at 16
	// and 64 concurrent callers, the same at one (BENCHMARKS.md). The key
	// then tells the server when it was minted, to the millisecond.
	KeyTimeOrdered
	// KeyDeterministic derives a UUIDv5 from Config.KeyNamespace (the
	// application's own, kept secret), the scope and the operation ID, so
	// a batch re-run on a machine that lost its journal still sends the
	// same keys. The key is a hash: it reveals neither the ID nor, without
	// the namespace, which ID it stands for.
	KeyDeterministic
)

// publicNamespaces are UUID namespaces anyone knows: the RFC 9562 ones and
// the default of earlier idem versions. Keys derived from them can be
// computed by anyone.
var publicNamespaces = []uuid.UUID{uuid.Nil, uuid.NameSpaceDNS, uuid.NameSpaceURL, uuid.NameSpaceOID,
	uuid.NameSpaceX500, uuid.MustParse("3f1c9a4e-6d2b-5e8f-9a7c-1b2d3e4f5a6b")}

// checkKeyNamespace refuses deterministic keys without a namespace of the
// application's own.
func checkKeyNamespace(kind KeyKind, ns uuid.UUID) error {
	if kind != KeyDeterministic {
		return nil
	}
	if slices.Contains(publicNamespaces, ns) {
		what := "is not set"
		if ns != uuid.Nil {
			what = fmt.Sprintf("is %s, a public namespace", ns)
		}
		return fmt.Errorf("%w: Config.KeyNamespace %s; KeyDeterministic needs a namespace of the application's own: generate one with uuid.New(), keep it with the application's secrets, and never change it (keys derived from a public namespace can be computed by anyone)",
			ErrInvalidConfig, what)
	}
	return nil
}

func (c *Client) mintKey(scope, id string) (string, error) {
	switch c.cfg.Keys {
	case KeyTimeOrdered:
		u, err := uuid.NewV7()
		return u.String(), err
	case KeyDeterministic:
		return uuid.NewSHA1(c.cfg.KeyNamespace, []byte(scope+"\x00"+id)).String(), nil
	default:
		u, err := uuid.NewRandom()
		return u.String(), err
	}
}

// Fingerprint returns the hex SHA-256 that identifies a request's content:
// the same operation ID with another fingerprint is refused with
// ErrFingerprintMismatch. It covers, in this order, a version tag, the
// method, the resolved URL, each significant header (canonical name and
// values, sorted by name) and the body, each written as an 8-byte
// big-endian length followed by its bytes, so that no two different
// requests share an encoding.
func Fingerprint(method, url string, header http.Header, significant []string, body []byte) string {
	f := wire.NewFingerprint()
	f.String("idem-fingerprint-v1")
	f.String(method)
	f.String(url)
	if len(significant) > 0 {
		names := make([]string, 0, len(significant))
		for _, n := range significant {
			names = append(names, http.CanonicalHeaderKey(n))
		}
		slices.Sort(names)
		for _, n := range slices.Compact(names) {
			f.String(n)
			f.Values(header.Values(n))
		}
	}
	f.Bytes(body)
	return f.Sum()
}

// Limits on what an Op may name.
const (
	maxIDLength    = 512
	maxScopeLength = 256
)

// prepared is a validated Op, ready to be journaled.
type prepared struct {
	scope, id, method, url string
	header                 http.Header
	body                   []byte
	fingerprint            string
	// givenFingerprint is the fingerprint of the request with its URL's
	// origin spelled as builds before the canonical spelling journaled it
	// (as Op.URL spelled it, or, for a relative one, as BaseURL does), when
	// that is not the canonical spelling, so that an operation they
	// journaled is still found as the same request.
	givenFingerprint string
	// ownHeader (ownBody): header (body) is the client's own copy,
	// which no one changes (Do's header, the standard client's header and
	// body; not an Op's body, which is the caller's). The standard
	// client's header may be shared, read-only, by the records of several
	// calls (roundTripper.split).
	ownHeader, ownBody bool
}

// prepare validates op. Every problem is reported before anything is
// journaled or sent.
func (c *Client) prepare(op Op) (prepared, error) {
	u, err := c.resolve(op.URL)
	if err != nil {
		return prepared{}, err
	}
	if u.given == "" {
		return c.prepareAt(op, u.url, copyHeader)
	}
	p, err := c.prepareAt(op, u.url, copyHeader)
	if err == nil {
		p.givenFingerprint = Fingerprint(p.method, u.given, p.header, op.SignificantHeaders, p.body)
	}
	return p, err
}

// headerUse is how prepareAt takes op.Header.
type headerUse int

const (
	// copyHeader: the caller's map (Do's Op), checked and copied.
	copyHeader headerUse = iota
	// ownHeader: a map made for this call (the standard client's),
	// checked but not copied again.
	ownHeader
	// checkedHeader: a map the standard client checked for a call before
	// and journals again, unchanged, for this one.
	checkedHeader
)

// prepareAt is prepare for op sent to the resolved URL u, its header taken
// as use says.
func (c *Client) prepareAt(op Op, u string, use headerUse) (prepared, error) {
	p := prepared{scope: op.Scope, id: op.ID, method: op.Method, url: u, body: op.Body, ownHeader: use == copyHeader}
	if p.scope == "" {
		p.scope = c.cfg.Scope
	}
	if err := checkName("Op.ID", p.id, maxIDLength, `give each logical operation a stable ID, such as "checkout/cart-42"`); err != nil {
		return prepared{}, err
	}
	if err := checkName("Op.Scope", p.scope, maxScopeLength, "use a tenant or namespace name"); err != nil {
		return prepared{}, err
	}
	if p.method == "" {
		p.method = http.MethodPost
	}
	if !wire.IsToken(p.method) {
		return prepared{}, invalidOp("Op.Method %q is not an HTTP method", p.method)
	}
	p.header = op.Header
	if use == copyHeader || p.header == nil {
		p.header = make(http.Header, len(op.Header))
	}
	toCheck := op.Header
	if use == checkedHeader {
		toCheck = nil // checked for a call before, and unchanged since
	}
	for name, values := range toCheck {
		canon := http.CanonicalHeaderKey(name)
		if c.secretHeader(canon) {
			return prepared{}, invalidOp("Op.Header carries %s, a credential; credentials are never journaled: add them in Config.Authorize, which runs on every attempt", canon)
		}
		if canon == c.keyHeader {
			return prepared{}, invalidOp("Op.Header sets %s; the client sets the idempotency key itself", canon)
		}
		if err := checkHeader("Op.Header", canon, values); err != nil {
			return prepared{}, err
		}
		if use == copyHeader {
			if _, twice := p.header[canon]; twice {
				// Another spelling of the name came first: one header,
				// every spelling's values, in one order whatever the map's.
				p.header[canon] = spellings(op.Header, canon, true, nil)
			} else {
				p.header[canon] = slices.Clone(values)
			}
		}
	}
	p.fingerprint = Fingerprint(p.method, p.url, p.header, op.SignificantHeaders, p.body)
	return p, nil
}

// checkHeader refuses a header net/http's transport would refuse to write
// on every attempt: journaled, it would stay pending for ever; a call's
// credential (the standard client's), not journaled, would fail every
// attempt of an operation that was. field names where the header came
// from; the error never repeats a value, which may be a credential.
func checkHeader(field, name string, values []string) error {
	if !wire.IsToken(name) {
		return invalidOp("%s name %q is not an HTTP token; nothing was journaled or sent", field, name)
	}
	for _, v := range values {
		if hasControl(v, true) {
			return invalidOp("%s %s has a value with a control character (CR, LF, NUL...), which HTTP cannot carry; nothing was journaled or sent", field, name)
		}
	}
	return nil
}

func checkName(field, v string, limit int, hint string) error {
	switch {
	case v == "":
		return invalidOp("%s is empty; %s", field, hint)
	case len(v) > limit:
		return invalidOp("%s is %d bytes, the limit is %d; %s", field, len(v), limit, hint)
	case !utf8.ValidString(v):
		return invalidOp("%s is not valid UTF-8", field)
	case hasControl(v, false):
		return invalidOp("%s %q contains control characters", field, v)
	}
	return nil
}

// hasControl reports whether s holds an ASCII control character (below
// 0x20, or DEL), a tab excepted if tabOK. It reads bytes, not runes: every
// byte of a rune of more than one, and of invalid UTF-8, is 0x80 or
// above, so the two readings find the same, and the bytes' is a few
// instructions each where strings.ContainsFunc's decoding and call cost
// dozens (every Do checks its ID, scope and header values).
func hasControl(s string, tabOK bool) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && (c != '\t' || !tabOK) || c == 0x7f {
			return true
		}
	}
	return false
}

// resolve makes ref absolute against Config.BaseURL and checks it. The
// last URL resolved is remembered: an application sends most of its
// operations to a few URLs, and parsing, resolving and printing one was
// about 1.5 us of a Do.
func (c *Client) resolve(ref string) (*resolvedURL, error) {
	if last := c.lastURL.Load(); last != nil && last.ref == ref {
		return last, nil
	}
	out, err := c.resolveURL(ref)
	if err == nil {
		c.lastURL.Store(out)
	}
	return out, err
}

// resolvedURL is an Op.URL and what resolve made of it: url as it is
// journaled and sent, and given, when not empty, the same URL with its
// origin spelled as ref spelled it.
type resolvedURL struct{ ref, url, given string }

func (c *Client) resolveURL(ref string) (*resolvedURL, error) {
	if ref == "" && c.base == nil {
		return nil, invalidOp("Op.URL is empty and Config.BaseURL is not set")
	}
	u, err := url.Parse(ref)
	if err != nil {
		return nil, invalidOp("Op.URL %q does not parse: %s", redactString(ref), parseReason(err))
	}
	if !u.IsAbs() {
		if c.base == nil {
			return nil, invalidOp("Op.URL %q is relative and Config.BaseURL is not set; give an absolute URL or set BaseURL", redactString(ref))
		}
		u = c.base.ResolveReference(u)
	}
	given, err := checkURL(ref, u)
	if err != nil {
		return nil, err
	}
	out := &resolvedURL{ref: ref, url: given}
	if b := c.base; b != nil {
		if !sameOrigin(u, b) {
			// Resume takes up only BaseURL's operations, whose credentials
			// Authorize holds: one sent elsewhere would be left behind.
			return nil, invalidOp("Op.URL %s goes to another origin than Config.BaseURL (%s://%s); a client's operations, credentials and Resume belong to its BaseURL: use a client whose BaseURL is that origin",
				redactURL(u), b.Scheme, b.Host)
		}
		if u.Scheme != b.Scheme || u.Host != b.Host {
			// BaseURL's origin spelled another way (the host's case, its
			// default port written out: RFC 6454's same origin) is
			// journaled in the origin's canonical spelling (b's, see
			// canonicalOrigin), as the standard client journals it, so
			// that Resume, which takes up the operations whose URL starts
			// with it, knows it as its own whichever worker sent it.
			u.Scheme, u.Host = b.Scheme, b.Host
			out.url, out.given = u.String(), given
		} else if cf := c.configured; cf != b {
			// Builds before the canonical spelling journaled a relative
			// Op.URL as Config.BaseURL spells its origin.
			u.Scheme, u.Host = cf.Scheme, cf.Host
			out.given = u.String()
		}
	}
	return out, nil
}

// checkURL checks an absolute URL that an operation is to be sent to, and
// returns it as it is journaled: without its fragment. u is changed.
func checkURL(ref string, u *url.URL) (string, error) {
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", invalidOp("Op.URL %q: scheme %q is not http or https", redactString(ref), u.Scheme)
	}
	if u.Host == "" {
		return "", invalidOp("Op.URL %q has no host", redactString(ref))
	}
	if u.User != nil {
		return "", invalidOp("Op.URL carries user credentials; credentials are never journaled: add them in Config.Authorize")
	}
	u.Fragment, u.RawFragment = "", ""
	return u.String(), nil
}

func (p prepared) record(key string, form keyForm) Record {
	return Record{Key: key, Scope: p.scope, ID: p.id, Method: p.method, URL: p.url,
		Header: p.header, Body: p.body, Fingerprint: p.fingerprint, KeyHeader: form.header, KeyQuoted: form.quoted}
}

// Operation is a journaled operation, returned by Begin, that has not
// necessarily been sent. Its key is stable: an application may store it
// (in its own database, say) before calling Send. It is safe for concurrent
// use; concurrent Sends put at most one attempt on the wire at a time.
type Operation struct {
	c     *Client
	key   string
	scope string
	id    string
	// The journaled request's method and URL and the link journaled with
	// it, immutable: Send's hooks see them from the start.
	method, url, link string
}

// Key returns the operation's idempotency key.
func (o *Operation) Key() string { return o.key }

// Scope returns the operation's scope.
func (o *Operation) Scope() string { return o.scope }

// ID returns the operation's ID.
func (o *Operation) ID() string { return o.id }

// Send drives the operation to a definitive answer, exactly as Do does for
// an operation that is already journaled.
func (o *Operation) Send(ctx context.Context) (*Result, error) {
	call := Call{Kind: CallSend, Scope: o.scope, ID: o.id, Key: o.key, Method: o.method, URL: o.url, Link: o.link}
	return o.c.observe(ctx, call, func(ctx context.Context) (*Result, error) {
		return o.c.run(ctx, o.scope, o.id, "", func(ctx context.Context) (*Result, error) {
			rec, err := o.c.journal.Get(ctx, o.key)
			if err != nil {
				return nil, err
			}
			return o.c.continueExisting(ctx, rec)
		})
	})
}
