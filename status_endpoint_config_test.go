package idem_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// droppingServer reads each write and drops the connection without an
// answer: the outcome is unknown and only the status checker can settle
// it. It counts the writes it received.
func droppingServer(t *testing.T) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var writes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			http.Error(w, "no such status endpoint", http.StatusInternalServerError)
			return
		}
		writes.Add(1)
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(srv.Close)
	return srv, &writes
}

// A StatusEndpoint whose base is no absolute http(s) URL can never answer:
// every status check fails, so an operation whose outcome is unknown can
// never be settled. It is bad input, like a StatusAdapter URL without a
// host (which New refuses): it must be refused by New, with a clear error,
// before any request is sent, not discovered once a write's outcome is
// already unknown.
func TestNewRefusesAStatusEndpointThatCannotBeAsked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, base string }{
		{"relative", "idempotency"}, // the host was forgotten
		{"rooted", "/idempotency"},  // Config.BaseURL does not apply to it
		{"not http", "ftp://127.0.0.1/idem"},
		{"no host", "http:///idempotency"},
		{"query", "{srv}/idempotency?tenant=7"}, // the key would go into the query, not the path
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, writes := droppingServer(t)
			base := strings.Replace(tc.base, "{srv}", srv.URL, 1)
			j := openJournal(t, t.TempDir()+"/ops.db")
			c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(base), Retry: fastRetry()})
			if err == nil {
				t.Cleanup(func() { _ = c.Close() })
				_, derr := c.Do(context.Background(), orderOp("op-1", 1))
				t.Errorf("New accepted StatusEndpoint(%q); Do then sent %d write(s) and ended with %v", base, writes.Load(), derr)
				return
			}
			assert.ErrorIs(t, err, idem.ErrInvalidConfig)
			assert.Zero(t, writes.Load())
		})
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// New's refusal of a BaseURL it cannot use quotes it redacted: a token in
// its query or userinfo is not in the error, which reaches logs.
func TestNewRefusesABadBaseURLWithoutQuotingItsSecrets(t *testing.T) {
	t.Parallel()
	for _, base := range []string{"ftp://api.example.test/?api_key=qk_live_SECRET", "/v1?api_key=qk_live_SECRET", "http://user:pw_SECRET@/x"} {
		_, err := idem.New(idem.Config{BaseURL: base, Journal: idem.NewMemoryJournal()})
		require.ErrorIs(t, err, idem.ErrInvalidConfig, base)
		assert.NotContains(t, err.Error(), "SECRET", base)
	}
}
