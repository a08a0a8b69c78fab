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

// Retention given as a bare number (24, meaning "24 h", is 24 ns) must be
// refused by New, naming the field, or be used sanely. Found by review:
// New accepts it, and an operation whose first answer was lost (the
// connection cut after the request was read) is expired at once instead of
// checked or re-sent with its key: one lost answer ends the protection
// the client exists for.
func TestReviewRetentionInNanosecondsRefusedOrUsable(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	j := idem.NewMemoryJournal()
	defer j.Close()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Retention: 24})
	if err != nil {
		if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "Retention") {
			t.Fatalf("New: %v; want ErrInvalidConfig naming Retention", err)
		}
		return
	}
	defer c.Close()
	res, err := c.Do(context.Background(), idem.Op{ID: "pay", URL: "/p"})
	if err != nil {
		t.Fatalf("New accepted Retention 24ns, and Do gave up after %d request(s), its first answer lost: %v", n.Load(), err)
	}
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("Do answered %d, want 201", res.StatusCode)
	}
}
