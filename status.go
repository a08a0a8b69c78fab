package idem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/wire"
)

// A StatusChecker asks the server what became of an operation whose outcome
// is unknown. It must never answer StatusNotFound unless the server said so
// explicitly: a failed or unreadable status call is an error, which leaves
// the operation unknown, never "not found" (which makes the client send the
// request again). With an error, the client reads only the Status's
// RetryAfter: the wait the server asked for before it is asked again (a
// 503 or 429 with Retry-After), honoured as an attempt's is.
type StatusChecker interface {
	CheckStatus(ctx context.Context, q StatusQuery) (Status, error)
}

// StatusQuery is what a StatusChecker gets to work with.
//
// A checker that has a Name() string method is named by it in errors and
// logs; any other is named by its type. Errors a checker returns are
// reported as the cause of ErrOutcomeUnknown, wrapped (so errors.Is finds
// ErrBadStatus when the checker wrapped it), prefixed with its name.
type StatusQuery struct {
	// Record is the journaled operation: its key and exact request.
	Record Record
	// Do sends req through the client's transport: it sets the idempotency
	// key header in the record's form, runs Config.Authorize (which sees
	// OperationFrom), applies the attempt timeout and follows redirects
	// only within the request's origin. The caller closes the response
	// body.
	Do func(req *http.Request) (*http.Response, error)
	// Request rebuilds the journaled request, byte for byte, for ctx. Do
	// counts sending it as an attempt: journaled first, fenced by the
	// lease, and counted in Record.Attempts. A checker that re-sends the
	// request must build it with Request.
	Request func(ctx context.Context) (*http.Request, error)
	// Classify is the client's Classifier.
	Classify Classifier
	// MaxResponseBytes is how much of a response body to read.
	MaxResponseBytes int64
}

// StatusState is what the server knows of a key.
type StatusState uint8

const (
	// StatusProcessing: the server is still working on the key.
	StatusProcessing StatusState = iota + 1
	// StatusCompleted: the server has the key's answer in Status.Response.
	StatusCompleted
	// StatusNotFound: the server holds nothing for the key and will execute
	// a request that carries it: the client sends it again, same key.
	StatusNotFound
)

func (s StatusState) String() string {
	switch s {
	case StatusProcessing:
		return wire.StateProcessing
	case StatusCompleted:
		return wire.StateCompleted
	case StatusNotFound:
		return wire.StateNotFound
	}
	return fmt.Sprintf("StatusState(%d)", uint8(s))
}

// Status is a StatusChecker's answer.
type Status struct {
	State StatusState
	// Response is the server's stored answer when State is StatusCompleted.
	Response *Response
	// RetryAfter is how long the server asked to wait before asking again;
	// with a checker's error too.
	RetryAfter time.Duration
	// BodyCut reports that Response.Body was cut at MaxResponseBytes; the
	// journal notes it.
	BodyCut bool
}

// ErrBadStatus is wrapped by errors from a status check whose answer does
// not parse or does not follow the expected shape (the HTTP status, a JSON
// field missing or of another type). The operation stays unknown, and the
// *OperationError the call returns matches it.
var ErrBadStatus = wire.ErrBadStatus

// StatusEndpoint returns a StatusChecker that asks GET {base}/{key}, with
// the key header and Config.Authorize, and reads the idem status format:
//
//	200 {"key":"…","state":"processing"}
//	200 {"key":"…","state":"completed","response":{"status":201,"header":{…},"body":"…"}}
//	404 {"key":"…","state":"not_found"}
//
// (the response body is base64 when "body_encoding" is "base64"). Any
// other answer, or no answer, is an error and leaves the operation unknown.
// The answer is read up to what a stored body of Config.MaxResponseBytes
// can take in it, escaped or in base64; a stored body longer than
// MaxResponseBytes is cut there, and the cut noted, as an attempt's is.
// The server package serves this endpoint.
//
// base is an absolute http or https URL with a host, and no query (the key
// goes in the path) and no userinfo (credentials belong in
// Config.Authorize, and a checker's URL is in its name, which errors, logs
// and the journal show): New refuses any other with ErrInvalidConfig, before
// anything is sent, rather than leave every unknown outcome unsettled.
func StatusEndpoint(base string) StatusChecker {
	return statusEndpoint{base: strings.TrimRight(base, "/")}
}

type statusEndpoint struct{ base string }

// checkConfig reports what New cannot accept in s.
func (s statusEndpoint) checkConfig() error {
	u, err := url.Parse(s.base)
	switch {
	case err != nil:
		return fmt.Errorf("Config.Status: StatusEndpoint(%q) does not parse: %v; give the endpoint's absolute URL, such as https://api.example.com/idempotency", redactString(s.base), redactError(err))
	case !u.IsAbs() || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("Config.Status: StatusEndpoint(%q) is not an absolute http or https URL with a host (Config.BaseURL does not apply to it); give the endpoint's whole URL, such as https://api.example.com/idempotency", redactURL(u))
	case u.User != nil:
		return fmt.Errorf("Config.Status: StatusEndpoint(%q) carries user credentials; add them in Config.Authorize, which runs for status checks too", redactURL(u))
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return fmt.Errorf("Config.Status: StatusEndpoint(%q) has a query or fragment, but the key is appended to the path ({base}/{key}); give the base without them, or use a StatusAdapter for an endpoint of another shape", redactURL(u))
	}
	return nil
}

// Name is the base without its query and userinfo, as every URL in the
// client's errors and logs (New refuses both anyway).
func (s statusEndpoint) Name() string { return "status endpoint " + redactString(s.base) }

func (s statusEndpoint) CheckStatus(ctx context.Context, q StatusQuery) (Status, error) {
	return getStatus(ctx, q, s.base+"/"+url.PathEscape(q.Record.Key), func(code int, _ http.Header, body []byte) (Status, error) {
		st, respBody, err := wire.DecodeStatus(code, body, q.Record.Key)
		if err != nil {
			return Status{}, err
		}
		switch st.State {
		case wire.StateProcessing:
			return Status{State: StatusProcessing}, nil
		case wire.StateNotFound:
			return Status{State: StatusNotFound}, nil
		}
		return Status{State: StatusCompleted,
			Response: &Response{StatusCode: st.Response.Status, Header: st.Response.Header, Body: respBody, Replayed: true}}, nil
	})
}

// getStatus asks GET u and decodes the answer with decode. A transport
// error, an answer larger than a stored answer of MaxResponseBytes can
// make it (envelopeBytes), a body that breaks off and a decode error are
// errors; decode errors wrap ErrBadStatus. A stored answer's body longer
// than MaxResponseBytes is cut there (Status.BodyCut). The answer's
// Retry-After is kept when decode gives none.
func getStatus(ctx context.Context, q StatusQuery, u string, decode func(int, http.Header, []byte) (Status, error)) (Status, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Status{}, fmt.Errorf("GET %s: %w", redactString(u), redactError(err))
	}
	req.Header.Set("Accept", "application/json")
	resp, err := q.Do(req)
	if err != nil {
		return Status{}, fmt.Errorf("GET %s: %w", redact(req), err)
	}
	defer resp.Body.Close()
	// An answer that settles nothing (a 503, a 429) still says when to ask
	// again.
	failed := Status{RetryAfter: RetryAfter(resp.Header, time.Now())}
	limit := envelopeBytes(q.MaxResponseBytes)
	body, truncated, err := readBody(resp.Body, limit, resp.ContentLength)
	if err != nil {
		return failed, fmt.Errorf("HTTP %d, reading the body: %w", resp.StatusCode, err)
	}
	if truncated {
		return failed, fmt.Errorf("%w: the answer is larger than %d bytes, the most a stored answer of Config.MaxResponseBytes (%d) takes in a status answer",
			ErrBadStatus, limit, q.MaxResponseBytes)
	}
	st, err := decode(resp.StatusCode, resp.Header, body)
	if err != nil {
		if !errors.Is(err, ErrBadStatus) {
			err = fmt.Errorf("%w: HTTP %d: %w", ErrBadStatus, resp.StatusCode, err)
		}
		return failed, err
	}
	switch st.State {
	case StatusProcessing, StatusNotFound:
	case StatusCompleted:
		if st.Response == nil || st.Response.StatusCode < 100 || st.Response.StatusCode > 599 {
			return failed, fmt.Errorf("%w: HTTP %d: completed without a response status", ErrBadStatus, resp.StatusCode)
		}
	default:
		return failed, fmt.Errorf("%w: HTTP %d: the decoder returned no state", ErrBadStatus, resp.StatusCode)
	}
	if st.RetryAfter == 0 {
		st.RetryAfter = failed.RetryAfter
	}
	if st.Response != nil && int64(len(st.Response.Body)) > q.MaxResponseBytes {
		// Cut as an attempt's answer is, and noted so.
		st.Response.Body = st.Response.Body[:q.MaxResponseBytes:q.MaxResponseBytes]
		st.BodyCut = true
	}
	return st, nil
}

// envelopeAllowance is what a status answer holds besides the stored
// answer's body: the key, the state, the stored answer's status and
// headers, the JSON around them.
const envelopeAllowance = 64 << 10

// envelopeBytes is the most a status answer is read to carry a stored
// answer whose body is limit bytes long: in a JSON string, each byte may be
// escaped to six ("\u00e9", "\ufffd" for a byte that is no UTF-8), and
// base64 takes four for three; plus envelopeAllowance. It saturates rather
// than overflow for a very large limit.
func envelopeBytes(limit int64) int64 {
	const most = math.MaxInt64 - 1 // readBody reads one byte past its limit
	if limit > (most-envelopeAllowance)/6 {
		return most
	}
	return 6*limit + envelopeAllowance
}

// StatusAdapter is a StatusChecker for a status endpoint of another shape
// than idem's, described in a few lines: where to ask, and how to read the
// answer. For a server that answers GET /v2/requests/{key}/outcome with
// {"phase":"done|running|unseen","http_status":…,"payload":…}:
//
//	idem.StatusAdapter{
//		Name: "payments outcome",
//		URL:  "https://pay.example.com/v2/requests/{key}/outcome",
//		Decode: func(code int, _ http.Header, body []byte) (idem.Status, error) {
//			var v struct {
//				Phase      string          `json:"phase"`
//				HTTPStatus int             `json:"http_status"`
//				Payload    json.RawMessage `json:"payload"`
//			}
//			if err := json.Unmarshal(body, &v); err != nil {
//				return idem.Status{}, err
//			}
//			switch v.Phase {
//			case "done":
//				return idem.Status{State: idem.StatusCompleted,
//					Response: &idem.Response{StatusCode: v.HTTPStatus, Body: v.Payload}}, nil
//			case "running":
//				return idem.Status{State: idem.StatusProcessing}, nil
//			case "unseen":
//				return idem.Status{State: idem.StatusNotFound}, nil
//			}
//			return idem.Status{}, fmt.Errorf("unknown phase %q", v.Phase)
//		},
//	}
//
// The request carries the key (in the record's form) and Config.Authorize's
// credentials, like every status check. Every error of Decode is a bad
// status (it wraps ErrBadStatus): the operation stays unknown, never "not
// found", and the error names the adapter. Decode must answer
// StatusNotFound only when the server said so explicitly.
type StatusAdapter struct {
	// Name names the adapter in errors and logs. Required.
	Name string
	// URL is the status URL, with {key} where the key goes (path-escaped).
	// Required: absolute http or https, without userinfo (credentials
	// belong in Config.Authorize).
	URL string
	// Decode reads the answer: its HTTP status, headers and body (at most
	// what a stored answer of Config.MaxResponseBytes takes in an
	// envelope, escaped as JSON: six times as much, and 64 KiB). A
	// Response.Body it returns longer than MaxResponseBytes is cut there,
	// and the cut noted. Required.
	Decode func(statusCode int, header http.Header, body []byte) (Status, error)
}

// checkConfig reports what New cannot accept in a.
func (a StatusAdapter) checkConfig() error {
	switch {
	case a.Name == "":
		return errors.New("Config.Status: StatusAdapter.Name is empty; name the status endpoint, for errors and logs")
	case !strings.Contains(a.URL, "{key}"):
		return fmt.Errorf("Config.Status: StatusAdapter %q: URL %q has no {key}; write where the key goes, such as https://api.example.com/requests/{key}", a.Name, redactString(a.URL))
	case a.Decode == nil:
		return fmt.Errorf("Config.Status: StatusAdapter %q: Decode is nil", a.Name)
	}
	u, err := url.Parse(strings.ReplaceAll(a.URL, "{key}", "k"))
	if err != nil || !u.IsAbs() || (u.Scheme != "http" && u.Scheme != "https") {
		return fmt.Errorf("Config.Status: StatusAdapter %q: URL %q is not an absolute http or https URL", a.Name, redactString(a.URL))
	}
	if u.User != nil {
		return fmt.Errorf("Config.Status: StatusAdapter %q: URL %q carries user credentials; add them in Config.Authorize, which runs for status checks too", a.Name, redactURL(u))
	}
	return nil
}

// CheckStatus implements StatusChecker.
func (a StatusAdapter) CheckStatus(ctx context.Context, q StatusQuery) (Status, error) {
	u := strings.ReplaceAll(a.URL, "{key}", url.PathEscape(q.Record.Key))
	return getStatus(ctx, q, u, a.Decode)
}

// String returns the adapter's name; errors and logs name it so.
func (a StatusAdapter) String() string { return a.Name }

// ReplayStatus returns a StatusChecker for servers that replay a stored
// answer when a key is sent again but offer no status endpoint (Stripe and
// most middlewares): it re-sends the journaled request, byte for byte, with
// the same key. A definitive answer is the operation's result; a 409 means
// the server is still processing; anything else is an error and leaves the
// operation unknown. A key conflict is no answer for the key: the server
// holds it for an earlier attempt in a form it tells apart from the
// replay (a fresh token in the URL, say), so the outcome stays unknown and
// the call stops; a status endpoint (StatusEndpoint, StatusAdapter) can
// settle it. Against a server that does not keep keys, a replay
// executes the request again: use it only with servers that do.
func ReplayStatus() StatusChecker { return replayStatus{} }

type replayStatus struct{}

func (replayStatus) Name() string { return "replay" }

func (replayStatus) CheckStatus(ctx context.Context, q StatusQuery) (Status, error) {
	req, err := q.Request(ctx)
	if err != nil {
		return Status{}, err
	}
	resp, err := q.Do(req)
	if err != nil {
		return Status{}, err
	}
	defer resp.Body.Close()
	body, cut, err := readBody(resp.Body, q.MaxResponseBytes, resp.ContentLength)
	d := q.Classify(Attempt{Response: resp, Body: body, Err: err, Written: true})
	stored := &Response{StatusCode: resp.StatusCode, Header: resp.Header, Body: body, Replayed: wire.Replayed(resp.Header)}
	switch d.Verdict {
	case Succeeded, Rejected, KeyConflict:
		return Status{State: StatusCompleted, Response: stored, BodyCut: cut}, nil
	case InProgress:
		return Status{State: StatusProcessing, RetryAfter: d.RetryAfter}, nil
	}
	return Status{RetryAfter: d.RetryAfter}, errors.New(d.Reason)
}

// readBody reads at most limit bytes and reports whether there was more.
//
// size is the body's length when the response says it (Content-Length),
// or -1: a body of known size within limit is read into a buffer of its
// size, not into io.ReadAll's 512 bytes and up, when that size is at most
// preallocBytes; a larger one into a buffer that starts there and doubles
// as bytes arrive. Content-Length is the server's word, not bytes
// received: an answer stalled after its headers must hold no more memory
// than it sent (a status answer's limit is several MaxResponseBytes).
func readBody(r io.Reader, limit, size int64) ([]byte, bool, error) {
	if size >= 0 && size <= limit {
		b := make([]byte, min(size, preallocBytes))
		n, err := io.ReadFull(r, b)
		for err == nil && int64(n) < size {
			b = append(b[:n], make([]byte, min(size-int64(n), int64(n)))...)
			var m int
			m, err = io.ReadFull(r, b[n:])
			n += m
		}
		switch {
		case err == io.EOF && n == 0:
			// No body at all (a HEAD's answer): a body cut short of its
			// Content-Length is the transport's io.ErrUnexpectedEOF.
			err = nil
		case err == io.EOF:
			// Cut short between two reads of a growing buffer.
			err = io.ErrUnexpectedEOF
		}
		return b[:n], false, err
	}
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if int64(len(b)) > limit {
		return b[:limit], true, err
	}
	return b, false, err
}

// preallocBytes is how much of an announced Content-Length readBody
// allocates before any of it arrives.
const preallocBytes = 64 << 10

// checkStatusConfig reports what New cannot accept in s, a checker of this
// package, by value or by pointer (a *StatusAdapter is a StatusChecker as
// well, and its method set holds checkConfig): a broken one is refused
// before anything is sent.
func checkStatusConfig(s StatusChecker) error {
	if a, ok := s.(*StatusAdapter); ok && a == nil {
		return errors.New("Config.Status: the *StatusAdapter is nil")
	}
	if c, ok := s.(interface{ checkConfig() error }); ok {
		return c.checkConfig()
	}
	return nil
}
