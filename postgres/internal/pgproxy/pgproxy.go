// Package pgproxy is a TCP proxy in front of PostgreSQL that injects the
// faults a fleet meets between itself and its database: every connection
// cut, one session cut, new connections refused for a while, replies
// delayed, and a message let through whose reply is lost (a COMMIT that
// the server carries out and whose acknowledgement never arrives).
//
// It reads the wire protocol's framing (a type byte and an int32 length;
// the startup message has no type byte) so that it can tell which message
// carries a statement. A statement is executed by a simple Query ('Q') or,
// in the extended protocol pgx uses, by a Bind ('B') of a statement parsed
// before ('P'), and a pipeline of them ends with a Sync ('S'), where an
// implicit transaction commits. The proxy answers SSLRequest and
// GSSENCRequest with 'N' itself: connect with sslmode=disable.
package pgproxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// Proxy forwards connections from its own address to a PostgreSQL server.
// It is safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	closed   bool
	sessions map[*session]struct{}
	refuse   time.Time // new connections are closed at once until then
	delay    time.Duration
	// delayChanged is closed when the delay changes or the proxy closes,
	// so that held messages are judged by the new delay at once.
	delayChanged chan struct{}
	faults       []*Fault // armed, in order: the first matching message fires one
	wg           sync.WaitGroup
}

// Start listens on a free port of 127.0.0.1 and forwards each connection to
// target ("host:port").
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, sessions: map[*session]struct{}{}, delayChanged: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address clients connect to.
func (p *Proxy) Addr() *net.TCPAddr { return p.ln.Addr().(*net.TCPAddr) }

// Close stops listening, cuts every session and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if !p.closed {
		close(p.delayChanged)
	}
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.CutAll()
	p.wg.Wait()
	return err
}

// CutAll closes every session, both ways, as a network failure would.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.sessions {
		s.cut()
	}
}

// CutBackend closes the session whose server process is pid (as
// pg_backend_pid() names it), and reports whether there was one.
func (p *Proxy) CutBackend(pid uint32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	found := false
	for s := range p.sessions {
		if s.backendPID() == pid {
			s.cut()
			found = true
		}
	}
	return found
}

// Blackhole ends the server's side of the session whose server process
// is pid, as a server does whose TCP keepalive gave up on a client behind
// a network that drops packets silently (a NAT or firewall that forgot
// the connection), while the client's side stays open and hears nothing
// more: what it sends is dropped, and nothing comes back, until it gives
// up itself. It reports whether there was such a session.
func (p *Proxy) Blackhole(pid uint32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	found := false
	for s := range p.sessions {
		if s.backendPID() == pid {
			s.mu.Lock()
			s.silent = true
			if s.server != nil {
				_ = s.server.Close()
			}
			s.mu.Unlock()
			found = true
		}
	}
	return found
}

// BackendPIDs returns the server process of every open session whose
// startup has named one, for CutBackend.
func (p *Proxy) BackendPIDs() []uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var pids []uint32
	for s := range p.sessions {
		if pid := s.backendPID(); pid != 0 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Sessions returns how many sessions are open.
func (p *Proxy) Sessions() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sessions)
}

// Refuse closes every new connection at once, before anything is read,
// for d from now; 0 accepts them again.
func (p *Proxy) Refuse(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = time.Now().Add(d)
}

// Delay holds every message of the server for d before it goes to the
// client; 0 forwards at once. A message held already is held for the new
// delay from when it came (Delay(0) lets it go now).
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
	if !p.closed {
		close(p.delayChanged)
		p.delayChanged = make(chan struct{})
	}
}

// Message is a message of a client, as a fault's match sees it.
type Message struct {
	// Type is the message's type byte: 'Q' (a simple query), 'P' (Parse),
	// 'B' (Bind), 'E' (Execute), 'S' (Sync), and so on.
	Type byte
	// SQL is the statement's text: a Query's, a Parse's, or for a Bind the
	// text of the statement it binds, as its session parsed it.
	SQL string
}

// Executes returns a match for a message that executes a statement (a
// simple Query, or a Bind) whose text holds every one of parts, compared
// without regard to case.
func Executes(parts ...string) func(Message) bool {
	return func(m Message) bool {
		if m.Type != 'Q' && m.Type != 'B' {
			return false
		}
		sql := strings.ToUpper(m.SQL)
		for _, part := range parts {
			if !strings.Contains(sql, strings.ToUpper(part)) {
				return false
			}
		}
		return true
	}
}

// IsCommit is a match for a message that executes COMMIT (or END) as a
// statement of its own, as pgx's Tx.Commit and a batch's queued COMMIT do:
// unlike Executes("commit"), it does not take a statement that merely
// names synchronous_commit.
func IsCommit(m Message) bool {
	if m.Type != 'Q' && m.Type != 'B' {
		return false
	}
	sql := strings.ToUpper(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(m.SQL), ";")))
	return sql == "COMMIT" || sql == "END" || sql == "COMMIT TRANSACTION" || sql == "COMMIT WORK"
}

// A Fault is an armed DropReply: it fires once, on the first message of
// any session that it matches.
type Fault struct {
	match  func(Message) bool
	refuse time.Duration // DropReplyAndRefuse's
	done   chan struct{}
	once   sync.Once
}

// Done is closed once the fault has fired: the message went to the server,
// the server answered the whole pipeline, the answer was dropped and the
// session closed.
func (f *Fault) Done() <-chan struct{} { return f.done }

// Fired reports whether the fault has fired.
func (f *Fault) Fired() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// DropReply arms a fault: the next client message that match accepts is
// forwarded with the rest of its pipeline (up to its Sync; a simple Query
// is a pipeline of its own), and once the server has answered all of it
// (its ReadyForQuery), its answer, and anything after it, is dropped and
// the session closed both ways. The server has then carried the pipeline
// out (a COMMIT in it is committed) while the client never hears of it.
func (p *Proxy) DropReply(match func(Message) bool) *Fault {
	f := &Fault{match: match, done: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = append(p.faults, f)
	return f
}

// DropReplyAndRefuse is DropReply for a database that goes out of reach
// with the reply: when the fault fires, new connections are refused for d,
// and when it ends the session, every other session is cut too.
func (p *Proxy) DropReplyAndRefuse(match func(Message) bool, d time.Duration) *Fault {
	f := p.DropReply(match)
	p.mu.Lock()
	defer p.mu.Unlock()
	f.refuse = d
	return f
}

// take returns the first armed fault that m fires, disarmed, or nil.
func (p *Proxy) take(m Message) *Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, f := range p.faults {
		if f.match(m) {
			p.faults = append(p.faults[:i:i], p.faults[i+1:]...)
			return f
		}
	}
	return nil
}

func (p *Proxy) currentDelay() (time.Duration, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay, p.delayChanged
}

// hold holds a message that came at since for the proxy's delay, judged
// again whenever the delay changes.
func (p *Proxy) hold(since time.Time) {
	for {
		d, changed := p.currentDelay()
		left := d - time.Since(since)
		if left <= 0 {
			return
		}
		t := time.NewTimer(left)
		select {
		case <-t.C:
			return
		case <-changed:
			t.Stop()
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
		}
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed || time.Now().Before(p.refuse) {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		// The server's first ReadyForQuery ends the startup, not a pipeline.
		s := &session{p: p, client: c, statements: map[string]string{}, readies: -1}
		p.sessions[s] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go func() {
			defer p.wg.Done()
			s.run()
			p.mu.Lock()
			delete(p.sessions, s)
			p.mu.Unlock()
		}()
	}
}

// session is one client connection and its connection to the server.
type session struct {
	p      *Proxy
	client net.Conn

	mu         sync.Mutex
	server     net.Conn
	cutDone    bool
	pid        uint32
	silent     bool   // blackholed: the server's side is closed, the client's hears nothing
	fault      *Fault // fired: dropping the server's messages
	waitFor    int    // the ReadyForQuery that ends the fault's pipeline (count of syncs sent)
	syncs      int    // Syncs and Queries sent to the server
	readies    int    // ReadyForQuery received from the server, after the startup's
	statements map[string]string
}

func (s *session) backendPID() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid
}

func (s *session) isSilent() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.silent
}

func (s *session) cut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cutDone = true
	_ = s.client.Close()
	if s.server != nil {
		_ = s.server.Close()
	}
}

func (s *session) run() {
	defer s.client.Close()
	if err := s.startup(); err != nil {
		return
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.fromServer()
		if !s.isSilent() {
			s.cut()
		}
	}()
	s.fromClient()
	s.cut()
	wg.Wait()
}

// Protocol codes of the startup-phase requests.
const (
	sslRequest    = 80877103
	gssencRequest = 80877104
	cancelRequest = 80877102
)

// startup reads the client's startup message (answering SSL and GSS
// encryption requests 'N'), dials the server and forwards it.
func (s *session) startup() error {
	for {
		msg, err := readStartup(s.client)
		if err != nil {
			return err
		}
		code := binary.BigEndian.Uint32(msg[4:8])
		if code == sslRequest || code == gssencRequest {
			if _, err := s.client.Write([]byte{'N'}); err != nil {
				return err
			}
			continue
		}
		server, err := net.Dial("tcp", s.p.target)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.server = server
		cut := s.cutDone
		s.mu.Unlock()
		if cut {
			_ = server.Close()
			return errors.New("cut")
		}
		_, err = server.Write(msg)
		if code == cancelRequest && err == nil {
			// The server answers a cancel request by closing.
			_, _ = io.Copy(io.Discard, server)
			return errors.New("cancel request")
		}
		return err
	}
}

func readStartup(r io.Reader) ([]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n < 8 || n > 1<<16 {
		return nil, fmt.Errorf("pgproxy: startup message of %d bytes", n)
	}
	msg := make([]byte, n)
	copy(msg, head[:])
	_, err := io.ReadFull(r, msg[4:])
	return msg, err
}

// readMessage reads one typed message: its type byte, length and body.
func readMessage(r io.Reader) ([]byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n < 4 || n > 1<<30 {
		return nil, fmt.Errorf("pgproxy: message %q of %d bytes", head[0], n)
	}
	msg := make([]byte, 1+n)
	copy(msg, head[:])
	_, err := io.ReadFull(r, msg[5:])
	return msg, err
}

// cstring splits a NUL-terminated string off b.
func cstring(b []byte) (string, []byte) {
	for i, c := range b {
		if c == 0 {
			return string(b[:i]), b[i+1:]
		}
	}
	return string(b), nil
}

// describe returns what a fault's match sees of a client message, and
// remembers the statements the session parses.
func (s *session) describe(msg []byte) Message {
	m := Message{Type: msg[0]}
	body := msg[5:]
	switch m.Type {
	case 'Q':
		m.SQL, _ = cstring(body)
	case 'P':
		name, rest := cstring(body)
		m.SQL, _ = cstring(rest)
		s.statements[name] = m.SQL
	case 'B':
		_, rest := cstring(body) // the portal
		name, _ := cstring(rest)
		m.SQL = s.statements[name]
	case 'C':
		if len(body) > 0 && body[0] == 'S' {
			name, _ := cstring(body[1:])
			delete(s.statements, name)
		}
	}
	return m
}

// fromClient forwards the client's messages until either side closes. A
// fault that fires forwards the rest of its pipeline and then stops
// reading the client: the session ends when the server has answered.
func (s *session) fromClient() {
	var fault *Fault
	for {
		msg, err := readMessage(s.client)
		if err != nil {
			return
		}
		if fault == nil {
			if f := s.p.take(s.describe(msg)); f != nil {
				fault = f
				if f.refuse > 0 {
					s.p.Refuse(f.refuse)
				}
				s.mu.Lock()
				s.fault = f
				s.mu.Unlock()
			}
		}
		if s.isSilent() {
			continue
		}
		ends := msg[0] == 'S' || msg[0] == 'Q'
		s.mu.Lock()
		server := s.server
		if ends {
			s.syncs++
			if fault != nil {
				s.waitFor = s.syncs
			}
		}
		s.mu.Unlock()
		if _, err := server.Write(msg); err != nil {
			return
		}
		if fault != nil && ends {
			// Wait for the server's side to end the session.
			_, _ = io.Copy(io.Discard, s.client)
			return
		}
		if msg[0] == 'X' { // Terminate
			return
		}
	}
}

// fromServer forwards the server's messages, noting the session's backend
// pid, after the proxy's delay; once a fault has fired it drops them, and
// ends the session at the ReadyForQuery of the fault's pipeline.
func (s *session) fromServer() {
	s.mu.Lock()
	server := s.server
	s.mu.Unlock()
	for {
		msg, err := readMessage(server)
		if err != nil {
			return
		}
		s.mu.Lock()
		if msg[0] == 'K' && len(msg) >= 9 {
			s.pid = binary.BigEndian.Uint32(msg[5:9])
		}
		if msg[0] == 'Z' {
			s.readies++
		}
		fault, done := s.fault, s.fault != nil && s.waitFor > 0 && s.readies >= s.waitFor
		s.mu.Unlock()
		if fault != nil {
			if done {
				if fault.refuse > 0 {
					s.p.CutAll()
				}
				fault.once.Do(func() { close(fault.done) })
				return
			}
			continue
		}
		s.p.hold(time.Now())
		if _, err := s.client.Write(msg); err != nil {
			return
		}
	}
}
