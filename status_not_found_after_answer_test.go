package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A server that answered the key with a 2xx status line has seen it: it
// applied the request. Its status endpoint saying afterwards that it never
// saw the key (a lost store record, a lying or misrouted endpoint) is not
// a reason to send the request again: the client holds proof that the
// server received it, and a new send is executed as a new request. The
// operation must stay unknown (or be parked for an operator), never be
// re-sent, and never be reported succeeded with a second execution's
// answer.
func TestNotFoundAfterA2xxStatusLineDoesNotSendAgain(t *testing.T) {
	t.Parallel()
	var executions atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/idempotency/") {
			key := strings.TrimPrefix(r.URL.Path, "/idempotency/")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"key":%q,"state":"not_found"}`, key)
			return
		}
		n := executions.Add(1)
		body := fmt.Sprintf(`{"order_id":"order-%d","padding":"................................"}`, n)
		if n == 1 {
			// The 201 status line and the start of the body reach the
			// client; the connection dies before the rest.
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(body[:10]))
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)

	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/idempotency"),
		Retry: fastRetry()})
	ctx := context.Background()
	res, err := c.Do(ctx, orderOp("op-1", 1))
	rec, lerr := c.Lookup(ctx, "default", "op-1")
	require.NoError(t, lerr)
	h, _ := j.History(ctx, rec.Key)
	for _, e := range h {
		t.Logf("  %s -> %s %v %s", e.From, e.To, e.Kind, e.Detail)
	}
	assert.Equal(t, int32(1), executions.Load(),
		"the server answered the key with a 201 status line, then its status endpoint said not_found: the client sent the request again, and the server executed it a second time")
	if err == nil {
		t.Errorf("Do reported success (%d %s) after the key was executed %d times", res.StatusCode, res.Body, executions.Load())
	} else {
		assert.False(t, errors.Is(err, idem.ErrRejected), "an applied request reported as rejected: %v", err)
	}
}
