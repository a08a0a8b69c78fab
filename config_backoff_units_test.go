package idem_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
)

// A RetryPolicy.MaxBackoff given as a bare number (5, meaning "5 s", is
// 5 ns), below the default MinBackoff of 100 ms, must be refused by New
// as a config error naming the field, or be used sanely. Found by review:
// New accepts it, and the first retry panics in RetryPolicy.backoff
// (rand.N of a negative number) on the caller's goroutine, after the
// operation was journaled and leased.
func TestReviewMaxBackoffBelowMinBackoffRefusedOrUsable(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	j := idem.NewMemoryJournal()
	defer j.Close()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Retry: idem.RetryPolicy{MaxBackoff: 5}})
	if err != nil {
		if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "MaxBackoff") {
			t.Fatalf("New: %v; want ErrInvalidConfig naming MaxBackoff", err)
		}
		return
	}
	defer c.Close()
	var res *idem.Result
	func() {
		defer func() {
			if p := recover(); p != nil {
				err = nil
				t.Errorf("New accepted MaxBackoff 5ns (below MinBackoff 100ms), and Do panicked on the first retry: %v", p)
			}
		}()
		res, err = c.Do(context.Background(), idem.Op{ID: "pay", URL: "/p"})
	}()
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if res != nil && res.StatusCode != http.StatusCreated {
		t.Fatalf("Do answered %d, want 201 after one retry", res.StatusCode)
	}
}
