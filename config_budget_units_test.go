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

// RetryPolicy.Budget given as a bare number (30, meaning "30 s", is 30 ns)
// must be refused by New, naming the field, or be used sanely. Found by
// review: New accepts it, and a single 503 ends the call, the operation
// left unknown, instead of the retry the client exists to make.
func TestReviewBudgetInNanosecondsRefusedOrUsable(t *testing.T) {
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
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Retry: idem.RetryPolicy{Budget: 30}})
	if err != nil {
		if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "Budget") {
			t.Fatalf("New: %v; want ErrInvalidConfig naming Budget", err)
		}
		return
	}
	defer c.Close()
	res, err := c.Do(context.Background(), idem.Op{ID: "pay", URL: "/p"})
	if err != nil {
		t.Fatalf("New accepted Budget 30ns, and Do gave up after %d request(s), the first a 503: %v", n.Load(), err)
	}
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("Do answered %d, want 201", res.StatusCode)
	}
}
