package server_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

// TestALockTimeoutInNanosecondsDoesNotLetDuplicatesRun: LockTimeout: 30,
// written by someone who meant seconds, is 30 ns, and New takes it as it
// takes any positive duration. Every lock is then stale as soon as it is
// taken: a duplicate sent while the first request's handler runs takes the
// key over and runs the handler a second time, at once, and the renewals
// spin (LockTimeout/3 is 10 ns). New refuses negative durations with a
// ConfigError; a lock shorter than any store round trip must be refused
// (or raised to a floor) as well, so that a unit mistake cannot turn the
// middleware into a pass-through.
func TestALockTimeoutInNanosecondsDoesNotLetDuplicatesRun(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	entered, open := make(chan struct{}), make(chan struct{})
	mw, err := server.New(server.Config{Store: server.NewMemoryStore(), Scope: server.SingleTenant, LockTimeout: 30})
	if err != nil {
		var ce *server.ConfigError
		require.True(t, errors.As(err, &ce), "a ConfigError: %v", err)
		assert.Equal(t, "LockTimeout", ce.Field)
		return
	}
	t.Cleanup(func() { assert.NoError(t, mw.Close()) })
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(entered)
			<-open
		}
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(open) })
	post := func() (*http.Response, error) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := srv.Client().Do(req)
		if err != nil {
			return nil, err
		}
		return resp, resp.Body.Close()
	}
	go func() { _, _ = post() }() // held in the handler until the test ends
	<-entered
	second, err := post()
	require.NoError(t, err)
	assert.Equal(t, http.StatusConflict, second.StatusCode, "a duplicate of a request still running is told it is in progress")
	assert.EqualValues(t, 1, runs.Load(), "the handler runs once while the first request holds the key")
}

// TestADurationInNanosecondsIsRefusedSayingWhatWasMeant: every duration of
// Config written as a bare number is refused, and the error says what the
// number was taken for and what was likely meant.
func TestADurationInNanosecondsIsRefusedSayingWhatWasMeant(t *testing.T) {
	t.Parallel()
	one := server.SingleTenant
	store := server.NewMemoryStore()
	for field, cfg := range map[string]server.Config{
		"Retention":     {Store: store, Scope: one, Retention: 30},
		"LockTimeout":   {Store: store, Scope: one, LockTimeout: 30},
		"RetryAfter":    {Store: store, Scope: one, RetryAfter: 30},
		"SweepInterval": {Store: store, Scope: one, SweepInterval: 30},
	} {
		_, err := server.New(cfg)
		var ce *server.ConfigError
		require.True(t, errors.As(err, &ce), "%s: a ConfigError: %v", field, err)
		assert.Equal(t, field, ce.Field)
		assert.Contains(t, err.Error(), "30ns", field)
		assert.Contains(t, err.Error(), "did you mean 30*time.Second?", field)
	}
}
