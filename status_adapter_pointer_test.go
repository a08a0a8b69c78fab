package idem_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem"
)

// New checks a StatusAdapter before anything is sent (a Name, a URL with
// {key}, absolute http(s), a Decode) and refuses a broken one with
// ErrInvalidConfig. A *StatusAdapter is a StatusChecker as well (its
// methods have value receivers), and passing the adapter by pointer, as
// Go code often passes structs, skips every check: New accepts an adapter
// with no Name, no {key} and no Decode, Do sends the write, and the first
// status check calls the nil Decode.
func TestNewChecksAStatusAdapterPassedByPointer(t *testing.T) {
	t.Parallel()
	var writes atomic.Int32
	srv := newScripted(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			_, _ = w.Write([]byte(`{}`)) // the status endpoint answers
			return
		}
		writes.Add(1)
		dropConn(w)
	})
	j := openJournal(t, t.TempDir()+"/ops.db")
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry(),
		Status: &idem.StatusAdapter{URL: srv.URL + "/status"}})
	if err == nil {
		t.Cleanup(func() { _ = c.Close() })
		var derr error
		panicked := func() (p any) {
			defer func() { p = recover() }()
			_, derr = c.Do(context.Background(), orderOp("op-1", 1))
			return nil
		}()
		t.Errorf("New accepted a *StatusAdapter with no Name, no {key} and no Decode; Do sent %d write(s), then returned %v (panic: %v)", writes.Load(), derr, panicked)
		return
	}
	assert.ErrorIs(t, err, idem.ErrInvalidConfig)
	assert.Zero(t, writes.Load())
}
