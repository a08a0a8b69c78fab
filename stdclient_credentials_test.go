package idem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A credential header net/http cannot write (a token with CR LF, as a
// header injection would have it) is split off the journaled headers, so
// the refusal TestHeaderNetHTTPCannotSendIsRefusedBeforeJournaling checks
// does not see it: the operation is journaled, each of its 5 attempts
// fails in net/http ("invalid header field value"), and it is left
// pending, to be sent by Resume without the call's credentials. Correct, as for any other header: ErrInvalidOp before
// anything is journaled, and nothing sent; the error never repeats the
// token.
func TestStandardClientCredentialThatCannotBeSentIsRefusedBeforeJournaling(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), SecretHeaders: []string{"X-Api-Key"}})
	for i, header := range []http.Header{
		{"Authorization": {"Bearer tok-secret\r\nX-Injected: 1"}},
		{"X-Api-Key": {"key-secret\x00"}},
	} {
		id := fmt.Sprintf("bad-cred-%d", i)
		req, err := http.NewRequestWithContext(idem.WithOperation(context.Background(), id), http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
		require.NoError(t, err)
		for name, values := range header {
			req.Header[name] = values
		}
		resp, err := c.StandardClient().Do(req)
		if resp != nil {
			_ = resp.Body.Close()
		}
		assert.ErrorIs(t, err, idem.ErrInvalidOp, "header %q", header)
		if err != nil {
			assert.NotContains(t, err.Error(), "secret", "the error repeats the credential")
		}
		_, err = j.Lookup(context.Background(), "default", id)
		assert.ErrorIs(t, err, idem.ErrNotFound, "nothing journaled for %s", id)
	}
	assert.Empty(t, srv.received(), "nothing sent")
}

// 50 calls at once, each its own operation and its own token: the server
// sees each operation's request with that operation's token only, and the
// MemoryJournal's records and histories hold none of the tokens. A guard
// of 660f142 (the credentials moved from a context value to the call's
// context object): held when written.
func TestStandardClientConcurrentCallsKeepTheirOwnCredentials(t *testing.T) {
	t.Parallel()
	const calls = 50
	var mu sync.Mutex
	var wrong []string
	srv := newScripted(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		want := "Bearer token-of-" + string(body)
		if got := r.Header.Values("Authorization"); len(got) != 1 || got[0] != want {
			mu.Lock()
			wrong = append(wrong, fmt.Sprintf("%s got %q", body, got))
			mu.Unlock()
		}
		w.WriteHeader(http.StatusCreated)
	})
	j := idem.NewMemoryJournal()
	c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry(),
		Authorize: func(r *http.Request) error { r.Header.Set("Authorization", "Bearer from-authorize"); return nil }})
	std := c.StandardClient()
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			id := fmt.Sprintf("op-%02d", i)
			ctx, cancel := context.WithTimeout(context.WithValue(idem.WithOperation(context.Background(), id), struct{}{}, i), time.Minute)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(id))
			if !assert.NoError(t, err) {
				return
			}
			req.Header.Set("Authorization", "Bearer token-of-"+id)
			resp, err := std.Do(req)
			if assert.NoError(t, err, id) {
				assert.Equal(t, http.StatusCreated, resp.StatusCode)
				_ = resp.Body.Close()
			}
		}()
	}
	close(start)
	wg.Wait()
	mu.Lock()
	assert.Empty(t, wrong, "a request carried another call's token, or Authorize's")
	mu.Unlock()
	n := 0
	for rec, err := range j.List(context.Background(), idem.Filter{}) {
		require.NoError(t, err)
		n++
		events, err := j.History(context.Background(), rec.Key)
		require.NoError(t, err)
		dump := fmt.Sprintf("%+v %+v", rec, events)
		assert.NotContains(t, dump, "token-of-", "a token reached the MemoryJournal's record or history")
		assert.NotContains(t, dump, "from-authorize", "Authorize's token reached the MemoryJournal")
	}
	assert.Equal(t, calls, n, "every call journaled (under a context derived from WithOperation's)")
}

// WithOperation(nil, …) panics as context.WithValue(nil, …) does. A
// guard: held when written. (Its doc does not say so; context.WithValue's
// does not either, its panic message does.)
func TestWithOperationOfANilContextPanics(t *testing.T) {
	t.Parallel()
	assert.Panics(t, func() { _ = idem.WithOperation(nil, "op") })                 //nolint:staticcheck // the nil is the test
	assert.Panics(t, func() { _ = idem.WithScopedOperation(nil, "tenant", "op") }) //nolint:staticcheck // the nil is the test
}
