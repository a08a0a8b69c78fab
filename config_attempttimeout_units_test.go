package idem_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem"
)

// AttemptTimeout given as a bare number (30, meaning "30 s", is 30 ns)
// must be refused by New, naming the field, or be used sanely. Found by
// review: New accepts it and every Do fails, after MaxAttempts tries of
// which none can be sent; the mistake shows only at the first call.
func TestReviewAttemptTimeoutInNanosecondsRefusedAtNew(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	j := idem.NewMemoryJournal()
	defer j.Close()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, AttemptTimeout: 30})
	if err != nil {
		if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "AttemptTimeout") {
			t.Fatalf("New: %v; want ErrInvalidConfig naming AttemptTimeout", err)
		}
		return
	}
	defer c.Close()
	if _, err := c.Do(context.Background(), idem.Op{ID: "pay", URL: "/p"}); err != nil {
		t.Fatalf("New accepted AttemptTimeout 30ns, and Do failed: %v", err)
	}
}
