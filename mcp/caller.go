package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
)

// CallerConfig configures a Caller. Journal, Server, Open and Scope are
// required.
type CallerConfig struct {
	// Journal keeps the tool calls: idem.OpenSQLite for one process,
	// postgres.Open for a fleet. The Caller never closes it.
	Journal idem.Journal
	// Server names the MCP server the calls go to, in the journal: its
	// calls are journaled as POST http://{Server}.mcp.invalid/tools/{tool}
	// (an address that never resolves: nothing is sent over HTTP by that
	// name), so that `idem ls` and `idem ui` show them. Letters, digits and
	// hyphens.
	Server string
	// Open opens a session to the server. The Caller opens one when it
	// first needs it and again after a session breaks, and Resume uses it
	// after a restart.
	Open func(ctx context.Context) (*mcp.ClientSession, error)
	// Scope is the journal's scope of the calls: it names whose
	// credentials Open connects with (the user, the agent's account), and
	// may add what makes the runtime's tool-call IDs unique (a
	// conversation), such as "user:" + userID + "/" + conversationID.
	// Callers on one journal whose Open connects as different identities
	// must have different scopes: a scope's calls are one set, so Resume
	// sends any of them with its Caller's credentials, and a tool-call ID
	// is answered with the scope's journaled result, whoever ran it. The
	// Caller cannot see the credentials in Open, so there is no default.
	Scope string
	// Client is the rest of the idem.Client's configuration (Retry,
	// LeaseDuration, Hooks, Logger...); its Journal, BaseURL, HTTPClient,
	// Status, Scope and Authorize are the Caller's, and its ResumeScopes
	// must be empty: a Caller resumes its own Scope only.
	Client idem.Config
}

// A Caller calls tools of an MCP server as idem operations: each call,
// named by the runtime's own tool-call ID (the model's "call_…"), is
// journaled with its tool, its arguments and a key before it is sent; the
// key travels in _meta[MetaKey]; a call whose answer was lost is settled
// by sending it again with the same key (a server with a Guard replays
// the first answer); after a crash, Resume finishes what was pending.
//
// The promise rests on the server: a server that does not honour keys
// runs a re-sent call again. Verify tells.
type Caller struct {
	c  *idem.Client
	tr *sessionTransport
}

var serverName = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)

// NewCaller returns a Caller for cfg. Close it when done.
func NewCaller(cfg CallerConfig) (*Caller, error) {
	switch {
	case cfg.Journal == nil:
		return nil, errors.New("idem/mcp: CallerConfig.Journal is nil; open one with idem.OpenSQLite")
	case cfg.Open == nil:
		return nil, errors.New("idem/mcp: CallerConfig.Open is nil; give a function that connects an mcp.Client to the server")
	case !serverName.MatchString(cfg.Server):
		return nil, fmt.Errorf("idem/mcp: CallerConfig.Server %q is not a name of letters, digits and hyphens (at most 63)", cfg.Server)
	case cfg.Scope == "":
		return nil, errors.New(`idem/mcp: CallerConfig.Scope is empty; name whose credentials Open connects with, such as "user:" + userID (and the conversation, if tool-call IDs are unique only within one): Callers that share a journal and one scope share their calls, and one would Resume the other's with its own credentials, or answer its tool-call ID with the other's result`)
	case len(cfg.Client.ResumeScopes) > 0:
		return nil, fmt.Errorf("idem/mcp: CallerConfig.Client.ResumeScopes is %q; a Caller resumes its own Scope only: another scope's calls would be sent with this Caller's credentials", cfg.Client.ResumeScopes)
	}
	ic := cfg.Client
	tr := &sessionTransport{open: cfg.Open, maxResult: ic.MaxResponseBytes}
	if tr.maxResult <= 0 {
		tr.maxResult = 4 << 20 // idem.Config's default
	}
	ic.Journal = cfg.Journal
	ic.BaseURL = "http://" + strings.ToLower(cfg.Server) + ".mcp.invalid"
	ic.HTTPClient = &http.Client{Transport: tr}
	ic.Status = idem.ReplayStatus()
	ic.Authorize = nil
	ic.Scope = cfg.Scope
	c, err := idem.New(ic)
	if err != nil {
		return nil, fmt.Errorf("idem/mcp: %w", err)
	}
	return &Caller{c: c, tr: tr}, nil
}

// Close stops the Caller's background work and closes its session.
func (c *Caller) Close() error {
	return errors.Join(c.c.Close(), c.tr.close())
}

// Client is the idem.Client underneath, for Lookup, Cancel and the like.
func (c *Caller) Client() *idem.Client { return c.c }

// Call calls tool with args as the tool call callID. The arguments are
// journaled and sent as json.Marshal writes args, in their order. Calling
// it again with the same callID (after an error, or after a restart)
// continues the same call under the same key and returns its result; the
// same arguments written otherwise (their members in another order, by
// Canonical) are the same call, continued as first written; other
// arguments under the same callID are idem.ErrFingerprintMismatch, and
// members whose names are alike but for case are refused (see Canonical).
// A result with IsError
// is a result. A JSON-RPC error the server answered is returned as a
// *jsonrpc.Error; any other error says what is known, as idem.Client.Do's
// do (idem.ErrOutcomeUnknown: Resume or another Call finishes it).
func (c *Caller) Call(ctx context.Context, callID, tool string, args any) (*mcp.CallToolResult, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		return nil, fmt.Errorf("%w: tool call %q: the arguments do not marshal to JSON: %v", idem.ErrInvalidOp, callID, err)
	}
	canon, err := Canonical(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: tool call %q: %v", idem.ErrInvalidOp, callID, err)
	}
	if tool == "" {
		return nil, fmt.Errorf("%w: tool call %q names no tool", idem.ErrInvalidOp, callID)
	}
	// The arguments are journaled and sent as written: a tool may read
	// them otherwise in another order (encoding/json matches member names
	// to fields without regard to case, the last one winning).
	op := idem.Op{ID: callID, URL: "/tools/" + url.PathEscape(tool), Body: raw,
		Header: http.Header{"Content-Type": {"application/json"}}}
	res, err := c.c.Do(ctx, op)
	if errors.Is(err, idem.ErrFingerprintMismatch) {
		if body, ok := c.sameArguments(ctx, callID, raw, canon); ok {
			// The same arguments written otherwise (an order, white
			// space): the same call, continued as first written.
			op.Body = body
			res, err = c.c.Do(ctx, op)
		}
	}
	return decodeResult(res, err)
}

// sameArguments returns the arguments journaled for callID when they are
// raw's by their canonical form. No tool reads them otherwise in another
// order: Canonical refuses an object with two member names alike but for
// case, which encoding/json would match to one field.
func (c *Caller) sameArguments(ctx context.Context, callID string, raw, canon []byte) ([]byte, bool) {
	rec, err := c.c.Lookup(ctx, "", callID)
	if err != nil {
		return nil, false
	}
	journaled, err := Canonical(rec.Body)
	if err != nil || !bytes.Equal(journaled, canon) {
		return nil, false
	}
	return rec.Body, true
}

// Resume finishes the tool calls of the Caller's Scope that were journaled
// but not settled (a crash, a lost answer), re-sending each with its key
// through a session from CallerConfig.Open. Never give it
// idem.ResumeAllScopes: other scopes' calls would go with this Caller's
// credentials. opts are idem.Client.Resume's: at start-up,
// idem.ResumeWait with a deadline finishes also the calls a Guard still
// runs (CodeInProgress) and those under the lease of a process that died.
func (c *Caller) Resume(ctx context.Context, opts ...idem.ResumeOption) (idem.ResumeReport, error) {
	return c.c.Resume(ctx, opts...)
}

// ErrNotSettled: the tool call is journaled, but its outcome is not known
// yet; Call it again, or Resume, to settle it.
var ErrNotSettled = errors.New("idem/mcp: tool call not settled")

// Result is the journaled result of the tool call callID, or an error: the
// call is not journaled (idem.ErrNotFound), or not settled yet
// (ErrNotSettled).
func (c *Caller) Result(ctx context.Context, callID string) (*mcp.CallToolResult, error) {
	rec, err := c.c.Lookup(ctx, "", callID)
	if err != nil {
		return nil, err
	}
	if !rec.State.Terminal() || rec.Response == nil {
		return nil, fmt.Errorf("%w: tool call %q is %s; Call it again or Resume", ErrNotSettled, callID, rec.State)
	}
	return decodeResult(&idem.Result{StatusCode: rec.Response.StatusCode, Body: rec.Response.Body}, nil)
}

// ErrResultTooLarge: the tool's result is larger than the Caller keeps
// (CallerConfig.Client.MaxResponseBytes, 4 MiB by default). The call is
// left unsettled (its outcome unknown): with a higher limit, Call or
// Resume settles it with the result the server keeps under its key.
var ErrResultTooLarge = errors.New("idem/mcp: tool result larger than MaxResponseBytes")

// decodeResult turns Do's answer back into the tool's.
func decodeResult(res *idem.Result, err error) (*mcp.CallToolResult, error) {
	if res == nil {
		return nil, err
	}
	if res.BodyCut {
		// Journaled by a Caller that handed a cut result on: the call is
		// settled, and the rest of its result is not in the journal.
		return nil, errors.Join(err, fmt.Errorf("%w: tool call %q was settled with its result cut at the client's MaxResponseBytes; the journal holds no more of it",
			ErrResultTooLarge, res.ID))
	}
	var env envelope
	if jerr := json.Unmarshal(res.Body, &env); jerr != nil {
		return nil, errors.Join(err, fmt.Errorf("idem/mcp: the server's answer (HTTP %d) does not parse: %v", res.StatusCode, jerr))
	}
	if env.Error != nil {
		return nil, env.Error
	}
	if err != nil || env.Result == nil {
		// Not a tool's answer: a problem the client classified (a key
		// conflict, a call still in progress).
		if err == nil {
			err = fmt.Errorf("idem/mcp: the server's answer (HTTP %d) holds no tool result", res.StatusCode)
		}
		return nil, err
	}
	out := new(mcp.CallToolResult)
	if jerr := json.Unmarshal(env.Result, out); jerr != nil {
		return nil, fmt.Errorf("idem/mcp: the tool's result does not parse: %v", jerr)
	}
	return out, nil
}

// sessionTransport sends the requests the idem.Client makes as tool calls
// on an MCP session: POST /tools/{tool} with the arguments and
// the key becomes tools/call with _meta[MetaKey]; the answer comes back
// as an HTTP response the client's classifier reads. It never sends HTTP
// by the request's URL.
type sessionTransport struct {
	open func(context.Context) (*mcp.ClientSession, error)
	// maxResult is the client's MaxResponseBytes: a larger result is not
	// handed to it, which would settle the call with a cut, unreadable
	// result.
	maxResult int64

	mu sync.Mutex
	// tooLarge holds the size of the result of each key whose result was
	// over maxResult: sending it again under the same limit gets the same
	// result, so it is not sent again by this Caller.
	tooLarge map[string]int
	cs       *mcp.ClientSession
	// closing counts the dropped sessions being closed: go-sdk's Close
	// waits for the calls still pending on the session, which may run
	// as long as their tools, so it runs beside the next calls, and
	// close waits for it.
	closing sync.WaitGroup
}

func (t *sessionTransport) session(ctx context.Context) (*mcp.ClientSession, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cs != nil {
		return t.cs, nil
	}
	cs, err := t.open(ctx)
	if err != nil {
		return nil, fmt.Errorf("idem/mcp: opening a session: %w", err)
	}
	t.cs = cs
	return cs, nil
}

// broken drops cs, so that the next call opens a new session at once,
// and closes it without holding up the calls that follow.
func (t *sessionTransport) broken(cs *mcp.ClientSession) {
	t.mu.Lock()
	dropped := t.cs == cs
	if dropped {
		t.cs = nil
		t.closing.Add(1)
	}
	t.mu.Unlock()
	if dropped {
		go func() {
			defer t.closing.Done()
			_ = cs.Close()
		}()
	}
}

func (t *sessionTransport) close() error {
	t.mu.Lock()
	cs := t.cs
	t.cs = nil
	t.mu.Unlock()
	var err error
	if cs != nil {
		err = cs.Close()
	}
	t.closing.Wait()
	return err
}

func (t *sessionTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		defer req.Body.Close()
	}
	tool, ok := strings.CutPrefix(req.URL.EscapedPath(), "/tools/")
	if req.Method != http.MethodPost || !ok {
		return nil, fmt.Errorf("idem/mcp: %s %s is not a tool call", req.Method, req.URL.Path)
	}
	tool, err := url.PathUnescape(tool)
	if err != nil {
		return nil, err
	}
	key, err := wire.ParseKey(req.Header.Get(wire.KeyHeader))
	if err != nil {
		return nil, fmt.Errorf("idem/mcp: a tool call without its key: %w", err)
	}
	var args json.RawMessage
	if req.Body != nil {
		if args, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
	}
	// The idem.Client learns from its trace that a request was written.
	// The session's own HTTP requests (opening it, the streamable
	// transport's POSTs) must not tell it so: they are not the call, and
	// a session on stdio makes none. The call is written when it is
	// handed to the session, and said so once, below.
	trace := httptrace.ContextClientTrace(req.Context())
	ctx := untraced{req.Context()}
	cs, err := t.session(ctx)
	if err != nil {
		return nil, err // nothing was sent
	}
	if trace != nil {
		// From here the call may reach the server: an error is an
		// unknown outcome, settled by sending it again with its key.
		// (A result known too large is an unknown outcome too.)
		if trace.WroteHeaders != nil {
			trace.WroteHeaders()
		}
		if trace.WroteRequest != nil {
			trace.WroteRequest(httptrace.WroteRequestInfo{})
		}
	}
	t.mu.Lock()
	size, big := t.tooLarge[key]
	t.mu.Unlock()
	if big {
		return nil, t.resultTooLarge(tool, size)
	}
	res, err := callTool(ctx, cs, &mcp.CallToolParams{Name: tool, Arguments: args, Meta: mcp.Meta{MetaKey: key}})
	if we := serverError(err); we != nil {
		return rpcResponse(req, we), nil
	}
	if err != nil {
		if !errors.Is(ctx.Err(), context.Canceled) {
			// The session failed under the call, or the attempt timed out
			// on it (a session gone silent). A call given up (canceled)
			// says nothing of the session, which the runtime's other calls
			// share.
			t.broken(cs)
		}
		return nil, err
	}
	rb, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("idem/mcp: the tool's result does not marshal: %w", err)
	}
	b, _ := json.Marshal(envelope{Result: rb})
	if int64(len(b)) > t.maxResult {
		// Cut at the limit, the result would be settled unreadable, and
		// lost for good. Unsettled, it stays the server's under the key:
		// with a higher limit, the call sent again is answered with it.
		t.mu.Lock()
		if t.tooLarge == nil {
			t.tooLarge = map[string]int{}
		}
		t.tooLarge[key] = len(b)
		t.mu.Unlock()
		return nil, t.resultTooLarge(tool, len(b))
	}
	h := http.Header{"Content-Type": {"application/json"}}
	if replayed, _ := res.Meta[MetaReplayed].(bool); replayed {
		h.Set(wire.ReplayedHeader, "true")
	}
	return response(req, http.StatusOK, h, b), nil
}

func (t *sessionTransport) resultTooLarge(tool string, size int) error {
	return fmt.Errorf("%w: tool %q answered a result of %d bytes, more than the Caller keeps (CallerConfig.Client.MaxResponseBytes, %d): the call is left unsettled; raise MaxResponseBytes and Call it again or Resume, and the server's stored result settles it",
		ErrResultTooLarge, tool, size, t.maxResult)
}

// callTool calls the tool on cs under a context that ends with ctx while
// the call waits, and not when it has returned: the client cancels an
// attempt's context as soon as the attempt returns, and go-sdk may still
// be reading the rest of the answer's stream under it; canceling that read
// closes the connection, and every call would dial a new one.
func callTool(ctx context.Context, cs *mcp.ClientSession, p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	callCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	res, err := cs.CallTool(callCtx, p)
	if !stop() {
		// ctx ended during the call, and ended it: say why.
		if err != nil {
			err = fmt.Errorf("%w: %v", context.Cause(ctx), err)
		}
		return res, err
	}
	// callCtx is never canceled now: it holds nothing but its values, and
	// is collected with the stream that reads under it.
	return res, err
}

// untraced is a context without its httptrace.ClientTrace, for the
// session's own HTTP requests.
type untraced struct{ context.Context }

func (c untraced) Value(key any) any {
	v := c.Context.Value(key)
	if _, ok := v.(*httptrace.ClientTrace); ok {
		return nil
	}
	return v
}

// JSON-RPC codes of go-sdk's own (not the server's): the call did not get
// through the session, or the session closed under it.
const (
	codeRejectedByTransport = -32005
	codeClientClosing       = -32003
	codeServerClosing       = -32004
)

// serverError is the server's JSON-RPC error response in err, and nil for
// a local failure. go-sdk hands the server's error over wrapped ("calling
// "tools/call": ..."); its own failures are no *jsonrpc.Error, or carry
// its codes: rejected by the transport (never reached the server, or an
// HTTP answer that is not the call's, such as an unknown session) and
// closing.
func serverError(err error) *jsonrpc.Error {
	var we *jsonrpc.Error
	if !errors.As(err, &we) {
		return nil
	}
	for _, local := range []int64{codeRejectedByTransport, codeClientClosing, codeServerClosing} {
		if errors.Is(err, &jsonrpc.Error{Code: local}) {
			return nil
		}
	}
	return we
}

// rpcResponse is a JSON-RPC error as the HTTP answer the client's
// classifier reads: a Guard's retryable errors as their HTTP kin (409 in
// progress, 503 store unavailable, 422 key reused); any other as a
// definitive rejection that carries the error.
func rpcResponse(req *http.Request, we *jsonrpc.Error) *http.Response {
	h := http.Header{}
	var data struct {
		RetryAfterMs int64 `json:"retryAfterMs"`
	}
	_ = json.Unmarshal(we.Data, &data)
	if data.RetryAfterMs > 0 {
		h.Set("Retry-After", strconv.FormatInt((data.RetryAfterMs+999)/1000, 10))
	}
	problem := func(status int, typ string) *http.Response {
		h.Set("Content-Type", wire.ProblemContentType)
		b, _ := json.Marshal(wire.Problem{Type: typ, Status: status, Detail: we.Message})
		return response(req, status, h, b)
	}
	switch we.Code {
	case CodeInProgress:
		return problem(http.StatusConflict, wire.ProblemInProgress)
	case CodeStoreUnavailable:
		return problem(http.StatusServiceUnavailable, wire.ProblemStoreFailed)
	case CodeKeyReused:
		return problem(http.StatusUnprocessableEntity, wire.ProblemKeyReused)
	}
	b, _ := json.Marshal(envelope{Error: we})
	h.Set("Content-Type", "application/json")
	return response(req, http.StatusBadRequest, h, b)
}

func response(req *http.Request, status int, h http.Header, body []byte) *http.Response {
	return &http.Response{
		Status: strconv.Itoa(status) + " " + http.StatusText(status), StatusCode: status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: h,
		Body: io.NopCloser(strings.NewReader(string(body))), ContentLength: int64(len(body)), Request: req,
	}
}
