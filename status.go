package idem

import (
	"context"
	"fmt"
	"io"
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
// request again).
type StatusChecker interface {
	CheckStatus(ctx context.Context, q StatusQuery) (Status, error)
}

// StatusQuery is what a StatusChecker gets to work with.
type StatusQuery struct {
	// Record is the journaled operation: its key and exact request.
	Record Record
	// Do sends req through the client's transport: it sets the idempotency
	// key header, runs Config.Authorize, applies the attempt timeout and
	// never follows redirects. The caller closes the response body.
	Do func(req *http.Request) (*http.Response, error)
	// Request rebuilds the journaled request, byte for byte, for ctx.
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
	// RetryAfter is how long the server asked to wait before asking again.
	RetryAfter time.Duration
}

// ErrBadStatus is wrapped by errors from a status check whose answer does
// not parse or does not follow the expected shape. The operation stays
// unknown.
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
// The server package serves this endpoint.
func StatusEndpoint(base string) StatusChecker {
	return statusEndpoint{base: strings.TrimRight(base, "/")}
}

type statusEndpoint struct{ base string }

func (s statusEndpoint) CheckStatus(ctx context.Context, q StatusQuery) (Status, error) {
	u := s.base + "/" + url.PathEscape(q.Record.Key)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Status{}, fmt.Errorf("status endpoint %q: %w", s.base, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := q.Do(req)
	if err != nil {
		return Status{}, fmt.Errorf("status check: %w", err)
	}
	defer resp.Body.Close()
	body, truncated, err := readBody(resp.Body, q.MaxResponseBytes)
	if err != nil {
		return Status{}, fmt.Errorf("status check: HTTP %d, reading the body: %w", resp.StatusCode, err)
	}
	if truncated {
		return Status{}, fmt.Errorf("%w: status answer larger than %d bytes", ErrBadStatus, q.MaxResponseBytes)
	}
	st, respBody, err := wire.DecodeStatus(resp.StatusCode, body, q.Record.Key)
	if err != nil {
		return Status{}, fmt.Errorf("status check: %w", err)
	}
	out := Status{RetryAfter: RetryAfter(resp.Header, time.Now())}
	switch st.State {
	case wire.StateProcessing:
		out.State = StatusProcessing
	case wire.StateNotFound:
		out.State = StatusNotFound
	case wire.StateCompleted:
		out.State = StatusCompleted
		out.Response = &Response{StatusCode: st.Response.Status, Header: st.Response.Header, Body: respBody, Replayed: true}
	}
	return out, nil
}

// ReplayStatus returns a StatusChecker for servers that replay a stored
// answer when a key is sent again but offer no status endpoint (Stripe and
// most middlewares): it re-sends the journaled request, byte for byte, with
// the same key. A definitive answer is the operation's result; a 409 means
// the server is still processing; anything else is an error and leaves the
// operation unknown. Against a server that does not keep keys, a replay
// executes the request again: use it only with servers that do.
func ReplayStatus() StatusChecker { return replayStatus{} }

type replayStatus struct{}

func (replayStatus) CheckStatus(ctx context.Context, q StatusQuery) (Status, error) {
	req, err := q.Request(ctx)
	if err != nil {
		return Status{}, err
	}
	resp, err := q.Do(req)
	if err != nil {
		return Status{}, fmt.Errorf("replay: %w", err)
	}
	defer resp.Body.Close()
	body, _, err := readBody(resp.Body, q.MaxResponseBytes)
	d := q.Classify(Attempt{Response: resp, Body: body, Err: err, Written: true})
	stored := &Response{StatusCode: resp.StatusCode, Header: resp.Header, Body: body, Replayed: wire.Replayed(resp.Header)}
	switch d.Verdict {
	case Succeeded, Rejected, KeyConflict:
		return Status{State: StatusCompleted, Response: stored}, nil
	case InProgress:
		return Status{State: StatusProcessing, RetryAfter: d.RetryAfter}, nil
	}
	return Status{}, fmt.Errorf("replay: %s", d.Reason)
}

// readBody reads at most limit bytes and reports whether there was more.
func readBody(r io.Reader, limit int64) ([]byte, bool, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if int64(len(b)) > limit {
		return b[:limit], true, err
	}
	return b, false, err
}
