package probe

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/internal/wire"
)

// Config says which endpoint to probe and how. Only URL is required;
// every other field's zero value means its default.
type Config struct {
	// URL is the endpoint: an absolute http or https URL without
	// credentials. Required.
	URL string
	// Method defaults to POST.
	Method string
	// Body is a valid request for the endpoint (empty when the endpoint
	// takes none): every request of the probe but the mismatch step's
	// sends it. A JSON body is sent with
	// Content-Type: application/json unless Header sets another.
	Body []byte
	// OtherBody is the body of the mismatch step (the same key with
	// another request). Defaults to Body with its first numeric leaf
	// incremented (else its first string leaf altered) when Body is JSON;
	// without it and without a JSON Body, the step is skipped.
	OtherBody []byte
	// Header is sent with every request: credentials, a tenant, a content
	// type. Its values are never reported, nor written in any error.
	Header http.Header
	// KeyHeader is the header to send the key in first. Defaults to
	// Idempotency-Key. When the endpoint ignores it, the probe tries the
	// other common names (Idempotency-Key, X-Idempotency-Key).
	KeyHeader string
	// StatusURL is the status endpoint, with {key} where the key goes,
	// such as https://api.example.com/idempotency/{key}. Without it, the
	// status step is skipped.
	StatusURL string
	// OtherURL and OtherMethod name another endpoint to send a used key
	// to (each defaults to URL and Method). Without either, that step is
	// skipped. Requests sent there may have effects too.
	OtherURL    string
	OtherMethod string
	// HTTPClient sends the requests; redirects are never followed.
	// Defaults to a client with a 30-second timeout. Its transport, when
	// it is net/http's (or nil), is copied with keep-alives off: net/http
	// sends a request that carries an idempotency key again by itself,
	// on a new connection, when a reused one dies before any reply, and
	// the probe's requests must each reach the endpoint once. A request
	// with a body is never sent again by any net/http transport. Each
	// request is sent with Connection: close, so a transport of another
	// type wrapping net/http's finds no connection of the probe's to
	// reuse; one the application left idle in a transport it shares may
	// still lead to a re-send of a request without a body, counted in
	// Report.Requests and Exchange.Resent.
	HTTPClient *http.Client
	// MaxRequests bounds the requests sent, status checks included; a step
	// that would go past it is skipped, and its finding says so. Defaults
	// to 20; at least 2.
	MaxRequests int
	// OnStep, when set, is called before each step sends anything, from
	// the goroutine that called Run.
	OnStep func(Step)
}

// DefaultMaxRequests is Config.MaxRequests's default.
const DefaultMaxRequests = 20

// Header names the probe tries the key in.
var keyHeaders = []string{wire.KeyHeader, "X-Idempotency-Key"}

// ErrInvalidConfig is wrapped by Run's errors about its Config; the
// message names the field.
var ErrInvalidConfig = errors.New("probe: invalid config")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

// withDefaults checks c and fills in its defaults.
func (c Config) withDefaults() (Config, error) {
	if err := checkURL("URL", c.URL); err != nil {
		return c, err
	}
	if c.Method == "" {
		c.Method = http.MethodPost
	}
	if !wire.IsToken(c.Method) {
		return c, invalid("Method %q is not an HTTP method", c.Method)
	}
	c.Method = strings.ToUpper(c.Method)
	if c.KeyHeader == "" {
		c.KeyHeader = wire.KeyHeader
	}
	if !wire.IsToken(c.KeyHeader) {
		return c, invalid("KeyHeader %q is not a header name", c.KeyHeader)
	}
	c.KeyHeader = http.CanonicalHeaderKey(c.KeyHeader)
	for name := range c.Header {
		canon := http.CanonicalHeaderKey(name)
		if canon == c.KeyHeader || canon == wire.KeyHeader || canon == "X-Idempotency-Key" {
			return c, invalid("Header sets %s, which carries the probe's keys", canon)
		}
	}
	if c.StatusURL != "" {
		if strings.Count(c.StatusURL, "{key}") != 1 {
			return c, invalid("StatusURL %q must hold {key} once, where the key goes, such as https://api.example.com/idempotency/{key}", c.StatusURL)
		}
		if err := checkURL("StatusURL", strings.ReplaceAll(c.StatusURL, "{key}", "k")); err != nil {
			return c, err
		}
	}
	if c.OtherURL != "" {
		if err := checkURL("OtherURL", c.OtherURL); err != nil {
			return c, err
		}
	}
	if c.OtherMethod != "" {
		if !wire.IsToken(c.OtherMethod) {
			return c, invalid("OtherMethod %q is not an HTTP method", c.OtherMethod)
		}
		c.OtherMethod = strings.ToUpper(c.OtherMethod)
	}
	if c.MaxRequests == 0 {
		c.MaxRequests = DefaultMaxRequests
	}
	if c.MaxRequests < 2 {
		return c, invalid("MaxRequests is %d; the first step alone sends 2", c.MaxRequests)
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	hc := *c.HTTPClient
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	hc.Transport = freshConnections(hc.Transport)
	c.HTTPClient = &hc
	return c, nil
}

// freshConnections returns rt with keep-alives off when it is net/http's
// transport (nil meaning http.DefaultTransport): net/http only sends a
// request again by itself on a connection that was reused, so a request
// on a connection of its own reaches the endpoint once, whatever happens
// to the connection. A handful of requests lose little to the handshakes.
func freshConnections(rt http.RoundTripper) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport
	}
	t, ok := rt.(*http.Transport)
	if !ok {
		return rt
	}
	t = t.Clone()
	t.DisableKeepAlives = true
	return t
}

func checkURL(field, v string) error {
	u, err := url.Parse(v)
	switch {
	case v == "":
		return invalid("%s is required", field)
	case err != nil:
		return invalid("%s %q does not parse: %v", field, v, err)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		return invalid("%s %q must be an absolute http or https URL", field, v)
	case u.User != nil:
		return invalid("%s must not carry credentials; put them in Header", field)
	}
	return nil
}

// AnswerError is Run's error when the endpoint refuses the probe's first
// request, so that nothing can be learned: the request itself, its
// credentials or its URL must be fixed first. The report holds what was
// sent.
type AnswerError struct {
	// Exchange is the first request's, under the last key form tried.
	Exchange Exchange
	// Tried lists the key forms tried, such as "Idempotency-Key (bare)".
	Tried []string
	// Hint says what to fix.
	Hint string
	// Excerpt is the start of the answer's body, with any value of
	// Config.Header blanked out.
	Excerpt string
}

func (e *AnswerError) Error() string {
	msg := fmt.Sprintf("probe: %s %s answered %s to the first request", e.Exchange.Method, e.Exchange.URL, statusText(e.Exchange))
	if len(e.Tried) > 1 {
		msg += " under every key form tried (" + strings.Join(e.Tried, ", ") + ")"
	}
	msg += ": " + e.Hint
	if e.Excerpt != "" {
		msg += fmt.Sprintf("; the answer began %q", e.Excerpt)
	}
	return msg
}

// ErrBudget is the cause of a request the budget (Config.MaxRequests) did
// not allow; Run plans its steps so that it never happens.
var ErrBudget = errors.New("probe: Config.MaxRequests reached")

// maxAnswerBytes is how much of an answer the probe reads.
const maxAnswerBytes = 1 << 20

// prober runs the steps of one Run.
type prober struct {
	cfg  Config
	mu   sync.Mutex
	sent int
}

// remaining is how many requests the budget still allows.
func (p *prober) remaining() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg.MaxRequests - p.sent
}

// form is how a key goes on the wire.
type form struct {
	header string
	quoted bool
}

func (f form) String() string { return headerForm(f.header, f.quoted) }

// target is where a request goes.
type target struct{ method, url string }

// answer is one exchange with what the steps compare.
type answer struct {
	Exchange
	header http.Header
	body   []byte
}

func (a answer) ok() bool { return a.Error == "" && isSuccess(a.Status) }

// replayed reports a replay header set to true.
func (a answer) replayed() bool { return a.ReplayHeader != "" }

// sameAs reports whether a carries the same status and body as b.
func (a answer) sameAs(b answer) bool {
	return a.Error == "" && b.Error == "" && a.Status == b.Status && bytes.Equal(a.body, b.body)
}

// send sends one request with key in f (no key when key is empty).
func (p *prober) send(ctx context.Context, t target, f form, key string, body []byte, bodyName string) (a answer) {
	a = answer{Exchange: Exchange{Method: t.method, URL: t.url, Body: bodyName}}
	if key != "" {
		a.KeyHeader, a.KeyForm, a.Key = f.header, formName(f.quoted), key
	}
	p.mu.Lock()
	if p.sent >= p.cfg.MaxRequests {
		p.mu.Unlock()
		a.Error = ErrBudget.Error()
		return a
	}
	p.sent++
	p.mu.Unlock()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, t.method, t.url, rd)
	if err != nil {
		a.Error = err.Error()
		return a
	}
	// Without GetBody a request with a body is not replayable, so no
	// net/http transport sends it again by itself, whatever the
	// connection (Request.isReplayable); redirects, which need it, are
	// not followed.
	req.GetBody = nil
	// A request without a body stays replayable, and a transport of the
	// caller's type keeps its keep-alives: net/http sends again only on a
	// connection it reused, so no probe request leaves one to reuse.
	req.Close = true
	var writes atomic.Int32
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { writes.Add(1) }}))
	defer func() {
		// The budget counts what reached the wire: a re-send made by a
		// transport the probe could not configure is a request too.
		if n := int(writes.Load()) - 1; n > 0 {
			a.Resent = n
			p.mu.Lock()
			p.sent += n
			p.mu.Unlock()
		}
	}()
	for name, vs := range p.cfg.Header {
		req.Header[http.CanonicalHeaderKey(name)] = append([]string(nil), vs...)
	}
	if body != nil && req.Header.Get("Content-Type") == "" && json.Valid(body) {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(f.header, wire.FormatKey(key, f.quoted))
	}
	start := time.Now()
	resp, err := p.cfg.HTTPClient.Do(req)
	if err != nil {
		a.Duration = time.Since(start)
		a.Error = p.redact(err.Error())
		return a
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	a.Duration = time.Since(start)
	if err != nil {
		a.Error = "reading the answer: " + p.redact(err.Error())
		return a
	}
	a.Status, a.header, a.body = resp.StatusCode, resp.Header, b
	for _, name := range wire.ReplayHeaders {
		if strings.EqualFold(strings.TrimSpace(resp.Header.Get(name)), "true") {
			a.ReplayHeader = name
			break
		}
	}
	a.RetryAfter = resp.Header.Get("Retry-After")
	a.ContentType = resp.Header.Get("Content-Type")
	if pr, ok := wire.ParseProblem(a.ContentType, b); ok {
		a.ProblemType = pr.Type
	}
	a.BodyBytes = len(b)
	sum := sha256.Sum256(b)
	a.BodySHA256 = hex.EncodeToString(sum[:8])
	return a
}

// redact blanks out every value of Config.Header found in s.
func (p *prober) redact(s string) string {
	for _, vs := range p.cfg.Header {
		for _, v := range vs {
			if v = strings.TrimSpace(v); len(v) >= 4 {
				s = strings.ReplaceAll(s, v, "[redacted]")
			}
			// A bearer token may appear without its scheme.
			if _, tok, ok := strings.Cut(v, " "); ok && len(tok) >= 4 {
				s = strings.ReplaceAll(s, tok, "[redacted]")
			}
		}
	}
	return s
}

// excerpt is the start of a body, printable and redacted.
func (p *prober) excerpt(b []byte) string {
	s := strings.ToValidUTF8(string(b[:min(len(b), 160)]), "?")
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	return p.redact(strings.TrimSpace(s))
}

// newKey is a fresh key for one step: a random UUID, which holds nothing
// about anyone.
func newKey() string { return uuid.NewString() }
