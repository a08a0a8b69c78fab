package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/server"
)

// MetaKey is the name, in a tools/call request's _meta, under which a
// client sends the call's idempotency key: a string of 1 to 255 printable
// ASCII characters, one per logical tool call, the same on every retry.
const MetaKey = "io.github.idemkit/idempotency-key"

// MetaReplayed is set to true in the _meta of a tool result that was not
// produced by this call but replayed from the store: the tool ran for an
// earlier call with the same key.
const MetaReplayed = "io.github.idemkit/replayed"

// JSON-RPC error codes of a guarded tool call (in the range JSON-RPC
// leaves to servers). Each error's data is an object with "key" and, where
// a retry can succeed, "retryAfterMs".
const (
	// CodeKeyReused: the key was used before with other arguments, or for
	// another tool. Use a new key for a new call.
	CodeKeyReused = -32081
	// CodeInProgress: a call with the same key is still running; retry
	// with the same key after retryAfterMs.
	CodeInProgress = -32082
	// CodeKeyRequired: the tool runs only with a key (GuardConfig.RequireKey).
	CodeKeyRequired = -32083
	// CodeKeyInvalid: the key is not a string of 1 to 255 printable ASCII
	// characters, or _meta and the Idempotency-Key header disagree.
	CodeKeyInvalid = -32084
	// CodeStoreUnavailable: the key store could not be reached; nothing
	// ran. Retry with the same key after retryAfterMs.
	CodeStoreUnavailable = -32085
	// CodeNoCaller: the call carries no caller identity to scope its key
	// by (GuardConfig.Scope).
	CodeNoCaller = -32086
)

// GuardConfig configures a Guard. Store is required.
type GuardConfig struct {
	// Store keeps the keys and the results: server.NewMemoryStore (which
	// forgets every key when the process restarts: a call sent again then
	// runs again), server.OpenSQLiteStore, postgres.OpenStore, redis.Open.
	// The Guard never closes it.
	Store server.Store
	// Tools are the names of the tools that run at most once per key.
	// A call to another tool passes through untouched, key or not.
	Tools []string
	// RequireKey refuses a call to one of Tools that carries no key
	// (CodeKeyRequired) instead of running it as an ordinary call.
	RequireKey bool
	// Scope names the caller a call comes from; keys are looked up per
	// scope, so one caller's key never reaches another's result. It must
	// come from the caller's authentication, never from the call itself.
	// The default is the user of the bearer token the streamable HTTP
	// transport verified (RequestExtra.TokenInfo.UserID); a call without
	// one is refused (CodeNoCaller). A server on stdio has one client: say
	// so with a constant.
	Scope func(ctx context.Context, req *mcp.CallToolRequest) string
	// Wait is how long a call waits for a concurrent call with the same
	// key to finish before it is answered CodeInProgress. Defaults to 10 s;
	// a negative Wait does not wait.
	Wait time.Duration
	// LockTimeout and Retention are the server middleware's
	// (server.Config): how long a running call holds its key without a
	// heartbeat (its process died), and how long a result is kept.
	LockTimeout, Retention time.Duration
	// MaxArgumentBytes is the largest canonical arguments accepted.
	// Defaults to 1 MiB; a negative one is refused.
	MaxArgumentBytes int64
	// Logger receives the diagnostics of the server middleware (keys as a
	// hash, never the scope or the arguments).
	Logger *slog.Logger
}

// A Guard makes chosen tools of an MCP server run at most once per key:
// the first call with a key runs the tool and stores its result (an
// isError result and a JSON-RPC error included); a later call with the
// same key and the same arguments gets that result again, marked
// MetaReplayed, without running the tool; the same key with other
// arguments is CodeKeyReused. It keeps the promise with the server
// package's middleware, serving each guarded call to it as an in-process
// request: the same stores, locks, heartbeats, fencing and take-over of a
// dead process's key as for HTTP.
type Guard struct {
	mw    *server.Middleware
	h     http.Handler
	tools map[string]bool
	cfg   GuardConfig
}

// NewGuard returns a Guard for cfg. Close it when the server stops.
func NewGuard(cfg GuardConfig) (*Guard, error) {
	if cfg.Store == nil {
		return nil, errors.New("idem/mcp: GuardConfig.Store is nil; give it a server.Store (server.NewMemoryStore for one process)")
	}
	if len(cfg.Tools) == 0 {
		return nil, errors.New("idem/mcp: GuardConfig.Tools is empty; name the tools that must run at most once per key")
	}
	if cfg.Wait == 0 {
		cfg.Wait = 10 * time.Second
	}
	if cfg.MaxArgumentBytes == 0 {
		cfg.MaxArgumentBytes = 1 << 20
	}
	if cfg.MaxArgumentBytes < 0 {
		return nil, fmt.Errorf("idem/mcp: GuardConfig.MaxArgumentBytes is negative (%d); leave it zero for its default of 1 MiB", cfg.MaxArgumentBytes)
	}
	g := &Guard{tools: map[string]bool{}, cfg: cfg}
	for _, t := range cfg.Tools {
		g.tools[t] = true
	}
	scfg := server.Config{
		Store: cfg.Store,
		Scope: func(r *http.Request) string { return r.Context().Value(scopeKey{}).(string) },
		// Every guarded call is a POST to /tools/{name}: the name and the
		// canonical arguments are its fingerprint.
		Methods:      []string{http.MethodPost},
		MaxKeyLength: wire.MaxKeyLength + len(continuedSuffix),
		LockTimeout:  cfg.LockTimeout,
		Retention:    cfg.Retention,
		// The arguments' own limit is checked before, on the canonical
		// text: this one only has to leave room for the body serve
		// writes with json.Marshal, which escapes <, > and & (\u003c, 6
		// bytes for 1) in the arguments and the tool's name. The body
		// stays json.Marshal's: the fingerprints of keys already stored
		// are digests of it.
		MaxBodyBytes: bodyLimit(cfg.MaxArgumentBytes, len(longestName(cfg.Tools))),
		Logger:       cfg.Logger,
		// runTool answers 5xx exactly when the key must be released, not
		// stored: the tool never ran (go-sdk's "unknown tool", a later
		// round's look at its first round), a later round asked for input
		// again, or the tool failed after its lock was lost. A first
		// round's panic it stores itself (runTool).
		StorePolicy: server.SkipServerErrors,
	}
	mw, err := server.New(scfg)
	if err != nil {
		return nil, fmt.Errorf("idem/mcp: %w", err)
	}
	g.mw = mw
	g.h = mw.Handler(http.HandlerFunc(runTool))
	return g, nil
}

// Close stops the Guard's background work (the store's sweeps). It does
// not close the store.
func (g *Guard) Close() error { return g.mw.Close() }

// Middleware is the Guard as go-sdk receiving middleware:
//
//	server.AddReceivingMiddleware(guard.Middleware)
func (g *Guard) Middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		call, ok := req.(*mcp.CallToolRequest)
		if method != "tools/call" || !ok || call.Params == nil || !g.tools[call.Params.Name] {
			return next(ctx, method, req)
		}
		key, err := keyOf(call)
		if err != nil {
			return nil, rpcError(CodeKeyInvalid, key, 0, "%v", err)
		}
		if key == "" {
			if g.cfg.RequireKey {
				return nil, rpcError(CodeKeyRequired, "", 0, "tool %q runs only with an idempotency key: send one in _meta[%q], the same on every retry of this call", call.Params.Name, MetaKey)
			}
			return next(ctx, method, req)
		}
		scope := g.scope(ctx, call)
		if scope == "" {
			return nil, rpcError(CodeNoCaller, key, 0, "tool %q: the call carries no caller identity to keep its key apart from other callers' (no authenticated user); the server must set GuardConfig.Scope", call.Params.Name)
		}
		args, err := Canonical(call.Params.Arguments)
		if err != nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("tool %q: %v", call.Params.Name, err)}
		}
		if int64(len(args)) > g.cfg.MaxArgumentBytes {
			return nil, tooLarge(call.Params.Name, g.cfg.MaxArgumentBytes)
		}
		return g.serve(ctx, &pending{next: next, method: method, req: call, continued: continued(call.Params)}, scope, key, args)
	}
}

func (g *Guard) scope(ctx context.Context, call *mcp.CallToolRequest) string {
	if g.cfg.Scope != nil {
		return g.cfg.Scope(ctx, call)
	}
	if e := call.Extra; e != nil && e.TokenInfo != nil {
		return e.TokenInfo.UserID
	}
	return ""
}

// keyOf is the call's key, from _meta or, on streamable HTTP, the
// Idempotency-Key header (alone, only on protocol 2025-06-18 and later,
// which has no batches); "" when it has none.
func keyOf(call *mcp.CallToolRequest) (string, error) {
	var key string
	if v, ok := call.Params.Meta[MetaKey]; ok {
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("_meta[%q] is a %T, not a string", MetaKey, v)
		}
		key = s
		if key == "" {
			return "", fmt.Errorf("_meta[%q] is empty", MetaKey)
		}
	}
	if e := call.Extra; e != nil && e.Header != nil {
		if n := len(e.Header.Values(wire.KeyHeader)); n > 1 {
			return "", fmt.Errorf("the request carries %d %s headers; send exactly one", n, wire.KeyHeader)
		}
		if h := e.Header.Get(wire.KeyHeader); h != "" {
			hk, err := wire.ParseKey(h)
			if err != nil {
				return "", fmt.Errorf("the %s header: %v", wire.KeyHeader, err)
			}
			if key != "" && hk != key {
				return "", fmt.Errorf("_meta[%q] and the %s header carry different keys", MetaKey, wire.KeyHeader)
			}
			// The header keys one HTTP request, which before protocol
			// 2025-06-18 may be a JSON-RPC batch of several calls
			// (go-sdk takes one then, its version told by the header
			// below, absent meaning 2025-03-26): each call would take it
			// as its own key, and the second be answered with the
			// first's result.
			if v := e.Header.Get("Mcp-Protocol-Version"); key == "" && v < "2025-06-18" {
				if v == "" {
					v = "none"
				}
				return "", fmt.Errorf("the %s header keys one HTTP request, and a request of MCP protocol version before 2025-06-18 (Mcp-Protocol-Version: %s) may be a JSON-RPC batch of several calls: send each call's key in _meta[%q]", wire.KeyHeader, v, MetaKey)
			}
			key = hk
		}
	}
	if len(key) > wire.MaxKeyLength {
		return "", fmt.Errorf("the key is %d bytes, the limit is %d", len(key), wire.MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return "", fmt.Errorf("the key holds byte %#x at %d: a key is printable ASCII", key[i], i)
		}
	}
	return key, nil
}

// continuedSuffix is appended to the key of a call's later rounds. It is
// longer than any key a client may send (wire.MaxKeyLength), so no
// client's key is the name of another key's later rounds (K+"#continued"
// was: the key "call_x#continued" shared an entry with call_x's later
// rounds), and being of one fixed length, two keys never share one.
var continuedSuffix = "#continued" + strings.Repeat("~", wire.MaxKeyLength+1-len("#continued"))

// continued reports whether p is a later round of a multi-round-trip call
// (SEP-2322): a tool answered "input required", and the client calls
// again with the same key and arguments, plus the input responses and the
// request state. Such a round must run the tool, not replay the first
// answer; but it must do the tool's work at most once, however the input
// is answered when the whole exchange is sent again after a lost answer
// (a person asked twice may answer otherwise). So the first round is kept
// under the key, and every later round under the key and continuedSuffix:
// the first of them that ends the call (any answer but "input required",
// which is released for the next round) is kept and replayed to the
// others. A later round first looks at what the key holds: with other
// arguments than the first round's it is CodeKeyReused; when the first
// round ended the call (an answer but "input required"), that answer is
// replayed and the tool does not run again. Only when the first round
// asked for input, or the key holds nothing (its Retention passed, or
// the first round came without the key), does the round run, under the
// key and continuedSuffix. One difference follows: a tool that panics in
// a later round has its key released, not a failure stored, and a retry
// runs that round again.
func continued(p *mcp.CallToolParamsRaw) bool {
	return len(p.InputResponses) > 0 || p.RequestState != ""
}

// asksForInput reports whether res is an "input required" answer: not
// the end of the call.
func asksForInput(res mcp.Result) bool {
	tr, _ := res.(*mcp.CallToolResult)
	return tr != nil && (tr.NeedsInput() || tr.InputRequests != nil)
}

type scopeKey struct{}

type pendingKey struct{}

// pending is the tool call the in-process request stands for.
type pending struct {
	next      mcp.MethodHandler
	method    string
	req       *mcp.CallToolRequest
	continued bool
	// look: the request only looks at what the key holds (see
	// continued); when it holds nothing, the tool does not run.
	look bool
	// panicked holds what a first round's tool panicked with, stored as
	// the key's failure, for serve to panic with again (see PanicError).
	panicked *any
}

// inputHeader marks the unstored answer of a later round that asks for
// input again; emptyHeader, a key that holds nothing; notRunHeader, the
// unstored error of a call whose tool never ran.
const (
	inputHeader  = "Idem-Mcp-Input-Required"
	emptyHeader  = "Idem-Mcp-Nothing-Stored"
	notRunHeader = "Idem-Mcp-Not-Run"
	lostHeader   = "Idem-Mcp-Lock-Lost"
)

// notRun reports whether err is go-sdk's answer to a call of a tool it
// does not have: nothing ran, and the tool may be added later (or be
// there on another replica sharing the store), so the key is released,
// not given that answer as its outcome. go-sdk's errors carry no other
// mark than their text.
func notRun(err error, tool string) bool {
	var we *jsonrpc.Error
	return errors.As(err, &we) && we.Code == jsonrpc.CodeInvalidParams && we.Message == fmt.Sprintf("unknown tool %q", tool)
}

// envelope is what is stored for a guarded call: the tool's result, or
// the JSON-RPC error its handler returned.
type envelope struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  *jsonrpc.Error  `json:"error,omitempty"`
}

// runTool is the handler behind the server middleware: it runs the tool
// and writes what it answered.
func runTool(w http.ResponseWriter, r *http.Request) {
	p := r.Context().Value(pendingKey{}).(*pending)
	w.Header().Set("Content-Type", "application/json")
	if p.look {
		w.Header().Set(emptyHeader, "true")
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if !p.continued {
		defer func() {
			// Stored as the key's outcome: the tool may have acted
			// before it panicked. (SkipServerErrors would release it.)
			if v := recover(); v != nil {
				v = newPanic(p.req.Params.Name, v)
				p.panicked = &v
				b, _ := json.Marshal(envelope{Error: &jsonrpc.Error{Code: jsonrpc.CodeInternalError,
					Message: fmt.Sprintf("tool %q failed part-way (it panicked), so it is not run again for this key: this failure is the key's outcome; it may have acted before it failed", p.req.Params.Name)}})
				w.WriteHeader(http.StatusOK)
				_, _ = w.Write(b)
			}
		}()
	}
	var env envelope
	res, err := p.next(r.Context(), p.method, p.req)
	switch {
	case err != nil:
		var we *jsonrpc.Error
		if !errors.As(err, &we) {
			we = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
		}
		env.Error = we
	default:
		b, merr := json.Marshal(res)
		if merr != nil {
			env.Error = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the tool's result cannot be stored: " + merr.Error()}
		}
		env.Result = b
	}
	status := http.StatusOK
	tr, _ := res.(*mcp.CallToolResult)
	if tr != nil && p.continued && asksForInput(tr) {
		// Not the end of the call: released for the next round.
		status = http.StatusServiceUnavailable
		w.Header().Set(inputHeader, "true")
	}
	failed := env.Error != nil || (tr != nil && tr.IsError)
	if failed && errors.Is(context.Cause(r.Context()), server.ErrLockNotRenewed) {
		// The tool failed after the middleware told it to stop, its lock
		// not kept: the failure is the interruption's. As for an HTTP
		// handler's 5xx then, it is not stored: the key is released,
		// and the call waits and runs again, as for a key still held.
		status = http.StatusInternalServerError
		w.Header().Set(lostHeader, "true")
	}
	if notRun(err, p.req.Params.Name) {
		status = http.StatusServiceUnavailable
		w.Header().Set(notRunHeader, "true")
	}
	b, _ := json.Marshal(env)
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// serve runs the call through the server middleware, waiting up to
// GuardConfig.Wait while a concurrent call with the key runs.
func (g *Guard) serve(ctx context.Context, p *pending, scope, key string, args []byte) (mcp.Result, error) {
	name := p.req.Params.Name
	body, _ := json.Marshal(struct {
		Tool      string          `json:"tool"`
		Arguments json.RawMessage `json:"arguments"`
	}{name, args})
	deadline := time.Now().Add(g.cfg.Wait)
	if !p.continued {
		return g.round(ctx, g.h, p, scope, key, key, body, deadline)
	}
	// A later round: first a look at the key's first round (see
	// continued), which runs nothing.
	look := *p
	look.look = true
	res, err := g.round(ctx, g.h, &look, scope, key, key, body, deadline)
	if err != errNothingStored && (err != nil || !asksForInput(res)) {
		return res, err
	}
	return g.round(ctx, g.h, p, scope, key+continuedSuffix, key, body, deadline)
}

// errNothingStored: a later round's key holds no first round.
var errNothingStored = errors.New("idem/mcp: nothing stored under the key")

// round serves one round of a call to h under the stored key, waiting
// until deadline while a concurrent call with the key runs.
func (g *Guard) round(ctx context.Context, h http.Handler, p *pending, scope, stored, key string, body []byte, deadline time.Time) (mcp.Result, error) {
	name := p.req.Params.Name
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		rctx := context.WithValue(context.WithValue(ctx, scopeKey{}, scope), pendingKey{}, p)
		r, err := http.NewRequestWithContext(rctx, http.MethodPost, "/tools/"+url.PathEscape(name), bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		r.Header.Set(wire.KeyHeader, wire.FormatKey(stored, true))
		r.Header.Set("Content-Type", "application/json")
		rec := newRecorder()
		h.ServeHTTP(rec, r)
		if p.panicked != nil {
			panic(*p.panicked)
		}
		if rec.header.Get(emptyHeader) != "" {
			return nil, errNothingStored
		}
		if rec.status == http.StatusOK || rec.header.Get(inputHeader) != "" || rec.header.Get(notRunHeader) != "" {
			return decode(rec, name, key)
		}
		prob, _ := wire.ParseProblem(rec.header.Get("Content-Type"), rec.body.Bytes())
		retry := retryAfter(rec.header)
		switch {
		case prob.Type == wire.ProblemInProgress, rec.header.Get(lostHeader) != "":
			if g.cfg.Wait < 0 || time.Now().Add(wait).After(deadline) {
				return nil, rpcError(CodeInProgress, key, retry, "tool %q: a call with this key is still running; retry with the same key after %v", name, retry)
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-t.C:
			}
			continue
		case prob.Type == wire.ProblemKeyReused:
			return nil, rpcError(CodeKeyReused, key, 0, "tool %q: this idempotency key was used before with other arguments or for another tool; a new call needs a new key", name)
		case prob.Type == wire.ProblemStoreFailed:
			return nil, rpcError(CodeStoreUnavailable, key, retry, "tool %q: the key store is unavailable, and the tool did not run; retry with the same key after %v", name, retry)
		case prob.Type == wire.ProblemBodyTooLarge:
			return nil, tooLarge(name, g.cfg.MaxArgumentBytes)
		case prob.Type == wire.ProblemKeyInvalid, prob.Type == wire.ProblemUnstorable:
			return nil, rpcError(CodeKeyInvalid, key, 0, "tool %q: %s", name, prob.Detail)
		default:
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("tool %q: the idempotency middleware answered %d %s", name, rec.status, prob.Detail)}
		}
	}
}

// decode is the stored or fresh answer of a guarded call.
func decode(rec *recorder, name, key string) (mcp.Result, error) {
	var env envelope
	if err := json.Unmarshal(rec.body.Bytes(), &env); err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("tool %q: the stored result of key does not parse: %v", name, err)}
	}
	if env.Error != nil {
		return nil, env.Error
	}
	res := new(mcp.CallToolResult)
	if err := json.Unmarshal(env.Result, res); err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("tool %q: the stored result does not parse: %v", name, err)}
	}
	// The mark is the Guard's to set: a tool's own says nothing.
	delete(res.Meta, MetaReplayed)
	if len(res.Meta) == 0 {
		res.Meta = nil
	}
	if wire.Replayed(rec.header) {
		if res.Meta == nil {
			res.Meta = mcp.Meta{}
		}
		res.Meta[MetaReplayed] = true
	}
	return res, nil
}

func tooLarge(tool string, limit int64) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("tool %q: the arguments are larger than the server accepts (%d bytes)", tool, limit)}
}

func retryAfter(h http.Header) time.Duration {
	if s, err := strconv.Atoi(h.Get("Retry-After")); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	return time.Second
}

func rpcError(code int64, key string, retry time.Duration, format string, args ...any) *jsonrpc.Error {
	data := map[string]any{}
	if key != "" {
		data["key"] = key
	}
	if retry > 0 {
		data["retryAfterMs"] = retry.Milliseconds()
	}
	b, _ := json.Marshal(data)
	return &jsonrpc.Error{Code: code, Message: fmt.Sprintf(format, args...), Data: b}
}

// bodyLimit is the largest body serve writes for arguments of at most
// maxArgs canonical bytes and a tool name of at most name bytes, every
// byte escaped at worst; math.MaxInt64 where that does not fit.
func bodyLimit(maxArgs int64, name int) int64 {
	const slack = 64 // {"tool":,"arguments":}
	if maxArgs > (math.MaxInt64-slack)/6-int64(name) {
		return math.MaxInt64
	}
	return 6*(maxArgs+int64(name)) + slack
}

func longestName(names []string) string {
	var l string
	for _, n := range names {
		if len(n) > len(l) {
			l = n
		}
	}
	return l
}
