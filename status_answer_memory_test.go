package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem"
)

// A status answer is now read up to 6 × MaxResponseBytes + 64 KiB, and
// an answer whose Content-Length is within that is given a buffer of
// that length before any byte of it arrives. A status endpoint (or a
// proxy in front of it) that announces a large body and stalls holds
// about 6 × MaxResponseBytes of the client's memory per check for the
// attempt timeout: Resume's concurrent checks, or many callers' Do, hold
// that many times over, for bytes never received. Here 8 checks stalled
// at their headers, MaxResponseBytes 1 MiB: the memory held must not
// exceed what MaxResponseBytes bounds (8 MiB), let alone six times it.
//
// Not parallel: it reads the heap, which other tests would share.
func TestStalledStatusAnswersHoldNoMemoryForBytesNotReceived(t *testing.T) {
	const (
		checks = 8
		limit  = 1 << 20
	)
	release := make(chan struct{})
	var stalled atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/idempotency/") {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", fmt.Sprint(6*limit+(64<<10)))
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			stalled.Add(1)
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		dropConn(w) // applied, the answer lost: a status check follows
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/idempotency"),
		Retry: fastRetry(), MaxResponseBytes: limit, AttemptTimeout: time.Minute})
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var wg sync.WaitGroup
	for i := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = c.Do(context.Background(), orderOp(fmt.Sprint("op-", i), 1))
		}()
	}
	defer func() {
		close(release)
		srv.CloseClientConnections()
		wg.Wait()
	}()
	for stalled.Load() < checks {
		time.Sleep(time.Millisecond)
	}
	// The client allocates once it has the headers; watch for a while.
	var most uint64
	for range 100 {
		var now runtime.MemStats
		runtime.ReadMemStats(&now)
		if now.HeapInuse > before.HeapInuse {
			most = max(most, now.HeapInuse-before.HeapInuse)
		}
		if most > checks*limit {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	assert.LessOrEqual(t, most, uint64(checks*limit),
		"%d status checks stalled at their headers (no body byte received) held %d MiB of heap, MaxResponseBytes %d MiB", checks, most>>20, limit>>20)
}
