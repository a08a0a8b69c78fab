package main

// Demo scaffolding: an MCP server (go-sdk, streamable HTTP on 127.0.0.1)
// with a send_email and a create_ticket tool behind an idemmcp.Guard,
// counting how many times each tool really ran. Its bearer tokens name
// the agent, and the Guard keeps each agent's keys apart by that name. It
// can lose the answer to a tool's next call after the tool ran, or hold a
// run of a tool until it is let go. The server lines a real MCP server
// would copy are in newMCPServer.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	idemmcp "github.com/idemkit/idem/mcp"
	"github.com/idemkit/idem/server"
)

// agentToken is the one bearer token the server accepts: agent-7's.
const agentToken = "tok_agent7_demo"

type emailArgs struct {
	To       string `json:"to"`
	Template string `json:"template"`
}

type emailResult struct {
	MessageID string `json:"message_id"`
	Status    string `json:"status"`
}

type ticketArgs struct {
	Queue string `json:"queue"`
	Title string `json:"title"`
}

type ticketResult struct {
	TicketID string `json:"ticket_id"`
	Status   string `json:"status"`
}

type toolServer struct {
	*httptest.Server
	guard *idemmcp.Guard

	toolCalls atomic.Int64 // tools/call requests that reached the server

	mu    sync.Mutex
	runs  map[string]int // by tool: the side effects
	byKey map[string]int // by the key in the call's _meta: the side effects
	lose  string         // the tool whose next answer is lost
	hold  *gate          // the next run of hold.tool for hold.to waits
}

type gate struct {
	tool, to string
	started  chan struct{} // closed when the tool runs
	release  chan struct{} // closed to let it finish
}

func startToolServer() (*toolServer, error) {
	s := &toolServer{runs: map[string]int{}, byKey: map[string]int{}}
	srv, guard, err := newMCPServer(s)
	if err != nil {
		return nil, err
	}
	s.guard = guard
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		if token != agentToken {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: "agent-7", Expiration: time.Now().Add(time.Hour)}, nil
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	s.Server = httptest.NewServer(s.faults(auth.RequireBearerToken(verify, nil)(h)))
	return s, nil
}

// newMCPServer is the part a real MCP server copies: its tools, and the
// Guard in front of the ones with side effects.
func newMCPServer(s *toolServer) (*mcp.Server, *idemmcp.Guard, error) {
	guard, err := idemmcp.NewGuard(idemmcp.GuardConfig{
		Store: server.NewMemoryStore(), // server.OpenSQLiteStore or postgres.OpenStore in a real one
		Tools: []string{"send_email", "create_ticket"},
		// Scope is left to its default: the user of the verified bearer
		// token, so that one agent's keys never reach another's results.
	})
	if err != nil {
		return nil, nil, err
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "office-tools", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "send_email", Description: "Send an e-mail from a template"}, s.sendEmail)
	mcp.AddTool(srv, &mcp.Tool{Name: "create_ticket", Description: "Open a ticket in a queue"}, s.createTicket)
	srv.AddReceivingMiddleware(guard.Middleware)
	return srv, guard, nil
}

func (s *toolServer) Close() {
	s.mu.Lock()
	if s.hold != nil {
		close(s.hold.release) // a held tool must not keep Close waiting
		s.hold = nil
	}
	s.mu.Unlock()
	s.Server.Close()
	_ = s.guard.Close()
}

func (s *toolServer) sendEmail(_ context.Context, req *mcp.CallToolRequest, in emailArgs) (*mcp.CallToolResult, emailResult, error) {
	s.mu.Lock()
	s.count(req)
	g := s.hold
	if g != nil && g.tool == "send_email" && g.to == in.To {
		s.hold = nil
	} else {
		g = nil
	}
	s.runs["send_email"]++
	n := s.runs["send_email"]
	s.mu.Unlock()
	if g != nil {
		close(g.started)
		<-g.release
	}
	return nil, emailResult{MessageID: fmt.Sprintf("msg_%03d", n), Status: "sent"}, nil
}

func (s *toolServer) createTicket(_ context.Context, req *mcp.CallToolRequest, in ticketArgs) (*mcp.CallToolResult, ticketResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.count(req)
	s.runs["create_ticket"]++
	return nil, ticketResult{TicketID: fmt.Sprintf("TCK-%d", 1000+s.runs["create_ticket"]), Status: "open"}, nil
}

// count counts a run under the key of its call; s.mu is held.
func (s *toolServer) count(req *mcp.CallToolRequest) {
	key, _ := req.Params.Meta[idemmcp.MetaKey].(string)
	s.byKey[key]++
}

// RunsUnder is how many times a tool ran for calls with key.
func (s *toolServer) RunsUnder(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byKey[key]
}

// loseNextAnswer makes the server run the next call of tool and lose its
// answer: the connection breaks before the answer leaves.
func (s *toolServer) loseNextAnswer(tool string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lose = tool
}

// holdNextRun makes the next run of tool for the recipient to wait, once
// started, until release is called.
func (s *toolServer) holdNextRun(tool, to string) (started <-chan struct{}, release func()) {
	g := &gate{tool: tool, to: to, started: make(chan struct{}), release: make(chan struct{})}
	s.mu.Lock()
	s.hold = g
	s.mu.Unlock()
	var once sync.Once
	return g.started, func() { once.Do(func() { close(g.release) }) }
}

// Runs is how many times each tool ran.
func (s *toolServer) Runs() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for k, v := range s.runs {
		out[k] = v
	}
	return out
}

// faults counts the tools/call requests and loses an answer when asked.
func (s *toolServer) faults(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !strings.Contains(string(body), `"tools/call"`) {
			next.ServeHTTP(w, r)
			return
		}
		s.toolCalls.Add(1)
		s.mu.Lock()
		lose := s.lose != "" && strings.Contains(string(body), `"name":"`+s.lose+`"`)
		if lose {
			s.lose = ""
		}
		s.mu.Unlock()
		if !lose {
			next.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(httptest.NewRecorder(), r) // the tool runs; its answer goes nowhere
		panic(http.ErrAbortHandler)               // and the connection breaks
	})
}
