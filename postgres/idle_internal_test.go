package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// A call whose session the server ended for idling, and whose context
// ended before it could run again on another session, said only
// "terminating connection due to idle-session timeout": a sweep cut off
// by its own bound (the middleware's SweepInterval) read as a failure of
// the database, and errors.Is(err, context.DeadlineExceeded) was false.
// The error now says both, the context's last.
func TestRetryEndedSaysTheContextEndedBeforeAnotherTry(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	ended := &pgconn.PgError{Severity: "FATAL", Code: idleSessionTimeout, Message: "terminating connection due to idle-session timeout"}
	runs := 0
	err := retryEnded(ctx, nil, endedIdle, func() error {
		runs++
		cancel() // the call's time runs out while the statement meets the ended session
		return ended
	})
	if runs != 1 {
		t.Fatalf("ran %d times after its context ended, want 1", runs)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("errors.Is(err, context.Canceled) = false for %q", err)
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != idleSessionTimeout {
		t.Errorf("the server's error is not reachable with errors.As: %q", err)
	}
	if !strings.HasSuffix(err.Error(), context.Canceled.Error()) {
		t.Errorf("the message does not end with the context's error: %q", err)
	}
}
