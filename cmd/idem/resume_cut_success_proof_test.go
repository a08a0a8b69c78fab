package main

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

// The application's call saw the server answer the key with a 201 status
// line whose body broke off (proof the server applied it), then could not
// reach the status endpoint and left the operation unknown. The proof is
// not journaled: the operator's "idem resume" finds not_found at the
// status endpoint (the server lost the key) and sends the request again,
// which the server executes a second time.
func TestResumeDoesNotResendAnOperationAnsweredWithACutSuccess(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	var executions atomic.Int32
	down.Store(true)
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

	path, j := openTestJournal(t)
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/idempotency"),
		Retry: idem.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, MaxStatusChecks: 1}})
	require.NoError(t, err)
	_, err = c.Do(context.Background(), idem.Op{ID: "op-1", URL: "/orders", Body: []byte(`{"n":1}`)})
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.NoError(t, c.Close())
	require.NoError(t, j.Close())
	time.Sleep(10 * time.Millisecond) // past the 5 ms backoff: due

	down.Store(false) // the status endpoint is back, and has lost the key
	r := cli(t, "", nil, "resume", "--journal", path, "--base-url", srv.URL, "--status-url", srv.URL+"/idempotency")
	t.Logf("idem resume: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	assert.Equal(t, int32(1), executions.Load(),
		"the server answered the key with a cut 201; idem resume found not_found and sent it again: executed %d times", executions.Load())
}
