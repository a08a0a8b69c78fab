package idem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem"
)

// A server that keeps keys and checks that a key comes back with the same
// request, method, path, query and body (as express-idempotency does, and
// the IETF draft allows), answering 422 key-reused otherwise. Its first
// request for a key is applied and its answer lost.
type queryCheckingServer struct {
	*httptest.Server
	mu       sync.Mutex
	seen     map[string]string // key -> the request it was first used with
	executed atomic.Int32
}

func newQueryCheckingServer(t *testing.T) *queryCheckingServer {
	s := &queryCheckingServer{seen: map[string]string{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		req := r.Method + " " + r.URL.RequestURI() + " " + string(body)
		s.mu.Lock()
		first, ok := s.seen[key]
		if !ok {
			s.seen[key] = req
		}
		s.mu.Unlock()
		switch {
		case !ok:
			s.executed.Add(1)
			dropConn(w) // applied; the answer is lost
		case first != req:
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusUnprocessableEntity)
			fmt.Fprint(w, `{"type":"urn:idem:problem:key-reused","title":"key reused with another request"}`)
		default:
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// Config.Authorize may put credentials in the URL ("what is sent is the
// journaled request with Authorize's headers, URL and Host"), and a token
// fetched afresh for a later attempt differs from the first. The status
// check by replay then meets a server that says the key was used with
// another request: the client sent the journaled request both times, so
// that other request is this operation's first attempt, which was applied.
// The client reports the operation rejected (ErrKeyConflict), terminal,
// "it will not be sent again": an applied write reported as a failure. A
// key conflict answering a replay of the journaled bytes says nothing of
// whether the first attempt took effect: the outcome is still unknown.
func TestAKeyConflictAnsweringAReplayIsNoRejection(t *testing.T) {
	t.Parallel()
	srv := newQueryCheckingServer(t)
	var tokens atomic.Int32
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(),
		Authorize: func(r *http.Request) error {
			q := r.URL.Query()
			q.Set("access_token", fmt.Sprintf("tok-%d", tokens.Add(1))) // a fresh token each time
			r.URL.RawQuery = q.Encode()
			return nil
		}})
	_, err := c.Do(context.Background(), orderOp("op-1", 1))
	assert.Equal(t, int32(1), srv.executed.Load())
	assert.NotErrorIs(t, err, idem.ErrRejected, "the write was applied")
	assert.NotErrorIs(t, err, idem.ErrKeyConflict, "the write was applied")
}
