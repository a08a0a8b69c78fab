// Package faultproxy is a real HTTP/1.1 proxy on 127.0.0.1 that sits between
// an idem client and a server and injects network and gateway faults, per
// request, at configured rates:
//
//	p, err := faultproxy.New(srv.URL, faultproxy.Config{
//		Rates:       map[faultproxy.Fault]float64{faultproxy.DropResponse: 0.05, faultproxy.Answer429: 0.05},
//		StatusRates: map[faultproxy.Fault]float64{faultproxy.StatusFail: 0.1},
//		Seed:        1,
//		Delay:       2 * time.Second,
//	})
//	err = p.Start()
//	defer p.Close()
//	… point the client at p.URL (and its status checker at p.URL + "/idempotency") …
//	log.Print(p.Stats())
//
// Faults come in two families. Request faults apply to every request that is
// not a status request:
//
//   - DropResponse: the request is forwarded, the upstream answers in full
//     (so it has committed), and the client's connection is closed without a
//     response;
//   - ResetRequest: part of the request body is read, then the connection is
//     reset (TCP RST); nothing reaches the upstream;
//   - ResetResponse: the request is forwarded, the upstream answers, and the
//     client gets the status line, the headers (with the full
//     Content-Length) and part of the body, then a reset;
//   - Delay: the request is forwarded, the upstream answers, and the answer
//     is held until the client gives up (closes its connection), or
//     Config.Delay passes, then dropped;
//   - Answer5xx, Answer429, Answer503: the proxy answers 500, 429 or 503
//     itself (with Retry-After: 1 for 429 and 503) and never contacts the
//     upstream;
//   - LateForward: the request is held for Config.Delay, whether or not its
//     client is still waiting, and only then forwarded: it reaches the
//     upstream after the client gave up on it, as a request queued in a
//     gateway or delayed in the network does. The client gets no answer.
//
// Status faults apply to status requests, GET requests whose path contains
// Config.StatusPath ("/idempotency/" by default):
//
//   - StatusFail: the proxy answers 500 itself;
//   - StatusHang: the proxy answers nothing until the client gives up (or
//     Config.Delay passes), then closes the connection.
//
// A request that draws no fault (Pass) is forwarded untouched, except for
// hop-by-hop headers. The proxy reads each request body in full before it
// forwards it, and each upstream answer in full before it answers; its
// requests to the upstream are not tied to the client's connection, so an
// upstream always finishes what a client started, as a real gateway that
// buffers does. It never answers from its own state: whatever the client
// gets is the upstream's answer, part of it, or an injected fault.
//
// Faults are drawn from math/rand/v2 sources seeded with Config.Seed, one
// for requests and one for status requests, under a mutex: for a given seed
// the n-th request (and the n-th status request) to arrive always draws the
// same fault. Which request arrives n-th is up to the scheduler when clients
// are concurrent. Config.Script and Config.StatusScript force the faults of
// the first requests, for targeted tests.
package faultproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Fault is what the proxy does to one request.
type Fault uint8

const (
	// Pass forwards the request and its answer untouched.
	Pass Fault = iota
	// DropResponse forwards the request, lets the upstream answer in full,
	// then closes the client's connection without a response.
	DropResponse
	// ResetRequest reads part of the request, then resets the client's
	// connection (TCP RST). Nothing reaches the upstream.
	ResetRequest
	// ResetResponse forwards the request, lets the upstream answer, sends
	// the client the status line, the headers (with the full
	// Content-Length) and part of the body, then resets the connection. An
	// empty body is cut inside the header block instead.
	ResetResponse
	// Delay forwards the request, lets the upstream answer, then holds the
	// answer until the client closes its connection (its timeout), until
	// Config.Delay passes, or until the proxy closes, and drops it.
	Delay
	// Answer5xx answers 500 without contacting the upstream.
	Answer5xx
	// Answer429 answers 429 with Retry-After: 1 without contacting the
	// upstream.
	Answer429
	// Answer503 answers 503 with Retry-After: 1 without contacting the
	// upstream.
	Answer503
	// LateForward holds the request for Config.Delay (until the client
	// gives up when Config.Delay is zero), then forwards it, and drops the
	// client's connection: the upstream applies the request after its
	// client stopped waiting for it. The client gets no answer.
	LateForward
	// StatusFail answers a status request with 500 without contacting the
	// upstream.
	StatusFail
	// StatusHang answers a status request with nothing until the client
	// closes its connection, Config.Delay passes, or the proxy closes, then
	// closes the connection. The upstream is not contacted.
	StatusHang

	numFaults
)

var faultNames = [numFaults]string{
	Pass: "Pass", DropResponse: "DropResponse", ResetRequest: "ResetRequest", ResetResponse: "ResetResponse",
	Delay: "Delay", Answer5xx: "Answer5xx", Answer429: "Answer429", Answer503: "Answer503", LateForward: "LateForward",
	StatusFail: "StatusFail", StatusHang: "StatusHang",
}

func (f Fault) String() string {
	if f < numFaults {
		return faultNames[f]
	}
	return fmt.Sprintf("Fault(%d)", uint8(f))
}

// Status reports whether f applies to status requests.
func (f Fault) Status() bool { return f == StatusFail || f == StatusHang }

// RequestFaults lists the faults of non-status requests, in the order in
// which they are drawn.
func RequestFaults() []Fault {
	return []Fault{DropResponse, ResetRequest, ResetResponse, Delay, Answer5xx, Answer429, Answer503, LateForward}
}

// StatusFaults lists the faults of status requests, in the order in which
// they are drawn.
func StatusFaults() []Fault { return []Fault{StatusFail, StatusHang} }

// InjectedHeader is set on every answer the proxy makes up (Answer5xx,
// Answer429, Answer503, StatusFail), naming the fault.
const InjectedHeader = "X-Faultproxy-Fault"

// DefaultStatusPath is the path part that marks a GET as a status request.
const DefaultStatusPath = "/idempotency/"

// MaxBodyBytes is the largest request or upstream response body the proxy
// handles; a larger request gets 413, a larger answer 502.
const MaxBodyBytes = 16 << 20

// Config says which faults the proxy injects, and how often.
type Config struct {
	// Rates maps each request fault to the probability that a non-status
	// request draws it. The rates must not be negative and must sum to at
	// most 1; the rest passes untouched.
	Rates map[Fault]float64
	// StatusRates maps each status fault (StatusFail, StatusHang) to the
	// probability that a status request draws it, under the same rules.
	StatusRates map[Fault]float64
	// Seed seeds the random sources that draw the faults.
	Seed int64
	// Delay bounds how long Delay and StatusHang hold a request when its
	// client does not give up first, and is how long LateForward holds a
	// request before forwarding it. Zero means until the client gives up
	// or the proxy closes. Set it longer than the client's timeout.
	Delay time.Duration
	// Script forces the faults of the first non-status requests, in the
	// order they arrive (Pass forwards one untouched); Rates apply after
	// it. StatusScript does the same for status requests.
	Script       []Fault
	StatusScript []Fault
	// StatusPath marks status requests: GET requests whose path contains
	// it. Defaults to DefaultStatusPath.
	StatusPath string
	// RetryAfter is the wait that 429 and 503 answers ask for, in whole
	// seconds. Defaults to 1 s; a negative value sends no Retry-After, for
	// tests that want the client's own backoff.
	RetryAfter time.Duration
}

// Stats counts what the proxy saw and did.
type Stats struct {
	// Requests and StatusRequests are the requests of each kind seen.
	Requests, StatusRequests int
	// Forwarded is how many requests were sent upstream, whatever the
	// client then got.
	Forwarded int
	// UpstreamErrors is how many forwards failed (answered 502).
	UpstreamErrors int
	// Faults counts the faults drawn; Pass counts the requests of both
	// kinds that drew none.
	Faults map[Fault]int
}

// Injected returns the number of requests of both kinds that drew a fault.
func (s Stats) Injected() int {
	n := 0
	for f, c := range s.Faults {
		if f != Pass {
			n += c
		}
	}
	return n
}

// String lists the figures, faults in their fixed order.
func (s Stats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "requests=%d status_requests=%d forwarded=%d upstream_errors=%d injected=%d:",
		s.Requests, s.StatusRequests, s.Forwarded, s.UpstreamErrors, s.Injected())
	for f := Pass; f < numFaults; f++ {
		fmt.Fprintf(&b, " %s=%d", f, s.Faults[f])
	}
	return b.String()
}

// Proxy is a fault-injecting proxy. Create it with New, then Start it; it is
// safe for concurrent use.
type Proxy struct {
	// URL is the proxy's base URL (http://127.0.0.1:PORT), set by Start.
	URL string

	upstream   *url.URL
	statusPath string
	delay      time.Duration
	retryAfter time.Duration
	transport  *http.Transport

	ctx    context.Context // canceled by Close: ends holds and forwards
	cancel context.CancelFunc
	srv    *http.Server
	served chan struct{}
	wg     sync.WaitGroup // open connections and running handlers

	mu        sync.Mutex
	started   bool
	closed    bool
	requests  picker
	status    picker
	stats     Stats
	closeOnce sync.Once
}

// picker draws the faults of one kind of request.
type picker struct {
	rng    *rand.Rand
	faults []Fault // in drawing order
	rates  []float64
	script []Fault
}

func newPicker(rates map[Fault]float64, order []Fault, script []Fault, seed, stream uint64) picker {
	p := picker{rng: rand.New(rand.NewPCG(seed, stream)), script: slices.Clone(script)}
	for _, f := range order {
		if r := rates[f]; r > 0 {
			p.faults = append(p.faults, f)
			p.rates = append(p.rates, r)
		}
	}
	return p
}

// pick returns the next fault. It draws one number per request beyond the
// script, so that the sequence depends only on the seed and the count.
func (p *picker) pick() Fault {
	if len(p.script) > 0 {
		f := p.script[0]
		p.script = p.script[1:]
		return f
	}
	u := p.rng.Float64()
	acc := 0.0
	for i, f := range p.faults {
		acc += p.rates[i]
		if u < acc {
			return f
		}
	}
	return Pass
}

// New checks cfg and returns a proxy to upstream (an absolute http URL; its
// path, if any, prefixes every forwarded path). Start starts it.
func New(upstream string, cfg Config) (*Proxy, error) {
	u, err := url.Parse(upstream)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("faultproxy: upstream %q must be an absolute http URL", upstream)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("faultproxy: upstream %q must not carry a query or fragment", upstream)
	}
	if err := checkRates("Rates", cfg.Rates, false); err != nil {
		return nil, err
	}
	if err := checkRates("StatusRates", cfg.StatusRates, true); err != nil {
		return nil, err
	}
	for _, f := range cfg.Script {
		if f.Status() || f >= numFaults {
			return nil, fmt.Errorf("faultproxy: Script holds %s, which is not a request fault", f)
		}
	}
	for _, f := range cfg.StatusScript {
		if f != Pass && !f.Status() {
			return nil, fmt.Errorf("faultproxy: StatusScript holds %s, which is not a status fault", f)
		}
	}
	if cfg.Delay < 0 {
		return nil, errors.New("faultproxy: Delay is negative")
	}
	p := &Proxy{
		upstream:   u,
		statusPath: cfg.StatusPath,
		delay:      cfg.Delay,
		retryAfter: cfg.RetryAfter,
		requests:   newPicker(cfg.Rates, RequestFaults(), cfg.Script, uint64(cfg.Seed), 0x9e3779b97f4a7c15),
		status:     newPicker(cfg.StatusRates, StatusFaults(), cfg.StatusScript, uint64(cfg.Seed), 0xbf58476d1ce4e5b9),
		stats:      Stats{Faults: map[Fault]int{}},
		served:     make(chan struct{}),
	}
	if p.statusPath == "" {
		p.statusPath = DefaultStatusPath
	}
	p.transport = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     90 * time.Second,
		// Bodies pass as they are: no transparent gzip.
		DisableCompression: true,
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p, nil
}

func checkRates(name string, rates map[Fault]float64, status bool) error {
	sum := 0.0
	for f, r := range rates {
		switch {
		case f == Pass || f >= numFaults:
			return fmt.Errorf("faultproxy: %s holds %s, which is not a fault", name, f)
		case f.Status() != status:
			return fmt.Errorf("faultproxy: %s holds %s, which belongs in the other map", name, f)
		case math.IsNaN(r) || r < 0 || r > 1:
			return fmt.Errorf("faultproxy: %s[%s] = %v is not a probability", name, f, r)
		}
		sum += r
	}
	if sum > 1+1e-9 {
		return fmt.Errorf("faultproxy: %s sum to %v, more than 1", name, sum)
	}
	return nil
}

// Start listens on a free port of 127.0.0.1, sets URL and serves until
// Close.
func (p *Proxy) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("faultproxy: Start after Close")
	}
	if p.started {
		return errors.New("faultproxy: already started")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("faultproxy: %w", err)
	}
	p.started = true
	p.URL = "http://" + ln.Addr().String()
	p.srv = &http.Server{
		Handler:           http.HandlerFunc(p.serve),
		ReadHeaderTimeout: 10 * time.Second,
		ConnState:         p.connState,
		// Dropped and reset connections are the point, not news.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go func() {
		defer close(p.served)
		_ = p.srv.Serve(ln)
	}()
	return nil
}

// connState counts open connections, so that Close waits for them.
func (p *Proxy) connState(_ net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		p.wg.Add(1)
	case http.StateHijacked, http.StateClosed:
		p.wg.Done()
	}
}

// Close stops the proxy: held requests are let go, forwards in progress are
// abandoned, every connection is closed, and Close returns once every
// goroutine the proxy started has returned. Clients of the proxy see their
// requests fail. Calling it again does nothing.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		started := p.started
		p.mu.Unlock()
		p.cancel()
		if started {
			_ = p.srv.Close()
			<-p.served
		}
		p.wg.Wait()
		p.transport.CloseIdleConnections()
	})
	return nil
}

// Stats returns the counts so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Faults = make(map[Fault]int, len(p.stats.Faults))
	for f, n := range p.stats.Faults {
		s.Faults[f] = n
	}
	return s
}

// Counts returns how many requests drew each fault (Pass: none).
func (p *Proxy) Counts() map[Fault]int { return p.Stats().Faults }

func (p *Proxy) isStatus(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.Contains(r.URL.Path, p.statusPath)
}

func (p *Proxy) draw(status bool) Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	var f Fault
	if status {
		p.stats.StatusRequests++
		f = p.status.pick()
	} else {
		p.stats.Requests++
		f = p.requests.pick()
	}
	p.stats.Faults[f]++
	return f
}

func (p *Proxy) count(field *int) {
	p.mu.Lock()
	*field++
	p.mu.Unlock()
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	// The connection's count is held while its handler runs, so this Add
	// cannot race Close's Wait.
	p.wg.Add(1)
	defer p.wg.Done()

	f := p.draw(p.isStatus(r))
	switch f {
	case Answer5xx, StatusFail:
		p.answer(w, r, f, http.StatusInternalServerError)
		return
	case Answer429:
		p.answer(w, r, f, http.StatusTooManyRequests)
		return
	case Answer503:
		p.answer(w, r, f, http.StatusServiceUnavailable)
		return
	case ResetRequest:
		readPart(r)
		reset(w)
		return
	case StatusHang:
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, MaxBodyBytes))
		p.hold(r)
		drop(w)
		return
	}

	// Pass, DropResponse, ResetResponse, Delay, LateForward: forward first.
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		drop(w) // the client went away mid-request
		return
	}
	if len(body) > MaxBodyBytes {
		http.Error(w, "faultproxy: request body too large", http.StatusRequestEntityTooLarge)
		return
	}
	if f == LateForward {
		p.holdLate(r)
		if p.ctx.Err() != nil {
			drop(w)
			return
		}
	}
	resp, err := p.forward(r, body)
	if err != nil {
		p.count(&p.stats.UpstreamErrors)
		if p.ctx.Err() != nil {
			drop(w)
			return
		}
		http.Error(w, "faultproxy: upstream: "+err.Error(), http.StatusBadGateway)
		return
	}
	switch f {
	case DropResponse:
		drop(w)
	case ResetResponse:
		resetMidBody(w, r, resp)
	case Delay:
		p.hold(r)
		drop(w)
	case LateForward:
		drop(w)
	default:
		resp.write(w)
	}
}

// upstreamResponse is an upstream's answer, read in full.
type upstreamResponse struct {
	status int
	header http.Header
	body   []byte
}

func (u *upstreamResponse) write(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range u.header {
		h[k] = v
	}
	if bodyAllowed(u.status) {
		h.Set("Content-Length", strconv.Itoa(len(u.body)))
	}
	w.WriteHeader(u.status)
	if bodyAllowed(u.status) {
		_, _ = w.Write(u.body)
	}
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// forward sends the request upstream, detached from the client's
// connection, and reads the answer in full.
func (p *Proxy) forward(r *http.Request, body []byte) (*upstreamResponse, error) {
	target := *p.upstream
	target.Path = strings.TrimSuffix(p.upstream.Path, "/") + r.URL.Path
	target.RawPath = ""
	if ep := strings.TrimSuffix(p.upstream.EscapedPath(), "/") + r.URL.EscapedPath(); ep != target.EscapedPath() {
		target.RawPath = ep
	}
	target.RawQuery = r.URL.RawQuery
	out, err := http.NewRequestWithContext(p.ctx, r.Method, target.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out.Header = withoutHopByHop(r.Header)
	if len(body) == 0 && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		out.Body, out.GetBody, out.ContentLength = nil, nil, 0
	}
	p.count(&p.stats.Forwarded)
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(resp.Body, MaxBodyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	if len(rb) > MaxBodyBytes {
		return nil, errors.New("answer body too large")
	}
	return &upstreamResponse{status: resp.StatusCode, header: withoutHopByHop(resp.Header), body: rb}, nil
}

// hopByHop are the headers that belong to one connection (RFC 9110 7.6.1).
var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func withoutHopByHop(h http.Header) http.Header {
	out := h.Clone()
	if out == nil {
		out = http.Header{}
	}
	for _, v := range h.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			out.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopByHop {
		out.Del(name)
	}
	out.Del("Content-Length")
	return out
}

// hold waits until the client closes its connection, Config.Delay passes,
// or the proxy closes.
func (p *Proxy) hold(r *http.Request) {
	var timeout <-chan time.Time
	if p.delay > 0 {
		t := time.NewTimer(p.delay)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-r.Context().Done():
	case <-timeout:
	case <-p.ctx.Done():
	}
}

// holdLate waits Config.Delay whatever the client does (or, when it is
// zero, until the client closes its connection), or until the proxy closes.
func (p *Proxy) holdLate(r *http.Request) {
	if p.delay <= 0 {
		p.hold(r)
		return
	}
	t := time.NewTimer(p.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-p.ctx.Done():
	}
}

// answer makes up an answer with code, after reading the request body so
// that the connection stays usable.
func (p *Proxy) answer(w http.ResponseWriter, r *http.Request, f Fault, code int) {
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, MaxBodyBytes))
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set(InjectedHeader, f.String())
	if (code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable) && p.retryAfter >= 0 {
		h.Set("Retry-After", fmt.Sprint(max(int64(p.retryAfter/time.Second), 1)))
	}
	w.WriteHeader(code)
	_, _ = fmt.Fprintf(w, "faultproxy: injected %s\n", f)
}

// readPart reads about half of the request body (what arrived of it).
func readPart(r *http.Request) {
	n := r.ContentLength / 2
	if r.ContentLength < 0 {
		n = 512
	}
	_, _ = io.CopyN(io.Discard, r.Body, n)
}

func hijack(w http.ResponseWriter) (net.Conn, *bufio.ReadWriter) {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// net/http closes the connection without an answer.
		panic(http.ErrAbortHandler)
	}
	return conn, buf
}

// drop closes the client's connection without an answer (a FIN).
func drop(w http.ResponseWriter) {
	conn, _ := hijack(w)
	_ = conn.Close()
}

// reset closes the client's connection with a TCP RST.
func reset(w http.ResponseWriter) {
	conn, _ := hijack(w)
	rst(conn)
}

func rst(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// resetMidBody sends the status line, the headers with the full
// Content-Length and half the body, then resets the connection. An empty
// body is cut inside the header block.
func resetMidBody(w http.ResponseWriter, r *http.Request, resp *upstreamResponse) {
	conn, buf := hijack(w)
	var head bytes.Buffer
	fmt.Fprintf(&head, "HTTP/%d.%d %d %s\r\n", r.ProtoMajor, r.ProtoMinor, resp.status, http.StatusText(resp.status))
	h := resp.header.Clone()
	h.Set("Content-Length", strconv.Itoa(len(resp.body)))
	_ = h.Write(&head)
	head.WriteString("\r\n")
	out := head.Bytes()
	if len(resp.body) > 0 {
		out = append(out, resp.body[:len(resp.body)/2]...)
	} else {
		out = out[:len(out)/2]
	}
	_, _ = buf.Write(out)
	_ = buf.Flush()
	rst(conn)
}
