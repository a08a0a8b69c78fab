package main

// The demo tool service: POST /tools/{tool} behind idem's server
// middleware, on 127.0.0.1, counting how many times each tool really ran.
// It can make one tool slow, so that a step times out while the tool is
// running. This is scaffolding, not something an agent runtime would copy:
// main.go is.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/server"
)

// toolService is the running demo service. It is safe for concurrent use.
type toolService struct {
	// URL is the service's base URL, such as http://127.0.0.1:41234.
	URL string

	mw     *server.Middleware
	srv    *http.Server
	served chan error
	stop   chan struct{} // lets a slow tool go at shutdown

	toolRequests atomic.Int64 // POST /tools/… requests that reached the service

	mu         sync.Mutex
	executions map[string]int    // by tool: the side effects
	results    map[string][]byte // by idempotency key: the second guard
	slow       *gate             // the next execution of slow.tool waits
}

type gate struct {
	tool    string
	started chan struct{} // closed when the tool has done its work
	release chan struct{} // closed to let it answer
}

// startToolService starts the service.
func startToolService() (*toolService, error) {
	mw, err := server.New(server.Config{
		Store: server.NewMemoryStore(), // server.OpenSQLiteStore in a real service
		// One agent runtime is the only caller; a service with several
		// callers returns the caller's tenant or credential instead.
		Scope: server.SingleTenant,
		// Tools answer 200 on success: the middleware stores and replays
		// whatever they answer.
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		mw.Close()
		return nil, err
	}
	s := &toolService{
		URL: "http://" + ln.Addr().String(),
		mw:  mw, served: make(chan error, 1), stop: make(chan struct{}),
		executions: map[string]int{}, results: map[string][]byte{},
	}
	mux := http.NewServeMux()
	mux.Handle("POST /tools/{tool}", mw.Handler(http.HandlerFunc(s.execute)))
	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
	s.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, "/tools/") {
				s.toolRequests.Add(1)
			}
			mux.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	go func() { s.served <- s.srv.Serve(ln) }()
	return s, nil
}

// Close stops the service.
func (s *toolService) Close() error {
	close(s.stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serr := <-s.served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return errors.Join(err, s.mw.Close())
}

// SlowNext makes the next execution of tool do its work, close started,
// and wait for release before it answers.
func (s *toolService) SlowNext(tool string) (started <-chan struct{}, release func()) {
	g := &gate{tool: tool, started: make(chan struct{}), release: make(chan struct{})}
	s.mu.Lock()
	s.slow = g
	s.mu.Unlock()
	var once sync.Once
	return g.started, func() { once.Do(func() { close(g.release) }) }
}

// Executions returns how many times each tool ran.
func (s *toolService) Executions() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.executions))
	for k, v := range s.executions {
		out[k] = v
	}
	return out
}

// ToolRequests returns how many tool requests reached the service.
func (s *toolService) ToolRequests() int { return int(s.toolRequests.Load()) }

// execute runs a tool. It sits behind the middleware, which runs it once
// per key; it also keeps each key's result itself (the second guard that
// the server package recommends), so that a run that somehow comes twice
// answers with the first result instead of acting again.
func (s *toolService) execute(w http.ResponseWriter, r *http.Request) {
	tool := r.PathValue("tool")
	key, ok := server.KeyFromContext(r.Context())
	if !ok {
		http.Error(w, "the tool service runs behind the idempotency middleware", http.StatusInternalServerError)
		return
	}
	var args map[string]any
	if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
		http.Error(w, "the arguments must be a JSON object: "+err.Error(), http.StatusBadRequest)
		return
	}

	s.mu.Lock()
	result, done := s.results[key]
	if !done {
		n := s.executions[tool] + 1
		switch tool {
		case "send_email":
			result = fmt.Appendf(nil, `{"message_id":"msg_%03d","status":"sent"}`, n)
		case "create_ticket":
			result = fmt.Appendf(nil, `{"ticket_id":"TCK-%d","status":"open"}`, 1000+n)
		default:
			s.mu.Unlock()
			http.Error(w, "unknown tool "+tool, http.StatusNotFound)
			return
		}
		s.executions[tool] = n
		s.results[key] = result
	}
	var g *gate
	if !done && s.slow != nil && s.slow.tool == tool {
		g, s.slow = s.slow, nil
	}
	s.mu.Unlock()

	if g != nil {
		close(g.started)
		select {
		case <-g.release:
		case <-s.stop:
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(result)
}
