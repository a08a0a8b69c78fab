package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// cutSuccessServer answers the first execution of a write with a 201
// status line whose body breaks off, every later one in full; its status
// endpoint fails (503) while down is set, then says it never saw the key.
func cutSuccessServer(t *testing.T, down *atomic.Bool, executions *atomic.Int32) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if key, ok := strings.CutPrefix(r.URL.Path, "/idempotency/"); ok {
			w.Header().Set("Content-Type", "application/json")
			if down.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"key":%q,"state":"not_found"}`, key)
			return
		}
		n := executions.Add(1)
		body := fmt.Sprintf(`{"order_id":"order-%d","padding":"................................"}`, n)
		if n == 1 {
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
	return srv
}

// The proof that the server applied the key (a 201 status line, its body
// cut) is kept by the call that saw it only. When that call ends before a
// status check answers (the endpoint down, MaxStatusChecks spent), the
// operation is left unknown; a later call finds not_found and sends the
// request again, which the server executes a second time. Parking on
// not_found after a cut success must not depend on which call asks.
func TestNotFoundAfterACutSuccessSeenByAnEarlierCallDoesNotSendAgain(t *testing.T) {
	t.Parallel()
	for _, later := range []string{"Do", "Resume"} {
		t.Run(later, func(t *testing.T) {
			t.Parallel()
			var down atomic.Bool
			var executions atomic.Int32
			down.Store(true)
			srv := cutSuccessServer(t, &down, &executions)
			policy := fastRetry()
			policy.MaxStatusChecks = 1
			c, j := newClient(t, idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/idempotency"),
				Retry: policy})
			ctx := context.Background()
			_, err := c.Do(ctx, orderOp("op-1", 1))
			require.Error(t, err, "the status endpoint was down: the first call cannot settle")
			rec, lerr := c.Lookup(ctx, "default", "op-1")
			require.NoError(t, lerr)
			t.Logf("after the first call: %s (%s)", rec.State, rec.LastError)

			down.Store(false) // the endpoint is back, and has lost the key
			switch later {
			case "Do":
				res, err := c.Do(ctx, orderOp("op-1", 1))
				if err == nil {
					t.Errorf("the second Do reported success: %d %s", res.StatusCode, res.Body)
				}
			case "Resume":
				// Resume until it takes the operation up (it is due after
				// the first call's short backoff).
				for i := 0; i < 200; i++ {
					rep, err := c.Resume(ctx)
					require.NoError(t, err)
					if rep.Claimed > 0 {
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			rec, lerr = c.Lookup(ctx, "default", "op-1")
			require.NoError(t, lerr)
			h, _ := j.History(ctx, rec.Key)
			for _, e := range h {
				t.Logf("  %s -> %s %v %s", e.From, e.To, e.Kind, e.Detail)
			}
			assert.Equal(t, int32(1), executions.Load(),
				"the server answered the key with a cut 201 (proof it applied it); a later %s found not_found and sent the request again: executed %d times, state %s",
				later, executions.Load(), rec.State)
		})
	}
}
