package idem_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A header net/http's transport refuses to write (a value with CR, LF or
// NUL, a name that is not a token) would be journaled as an operation that
// can never be sent, pending for ever: it is refused before, through the
// standard client and through Do alike.
func TestHeaderNetHTTPCannotSendIsRefusedBeforeJournaling(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
	bg := context.Background()
	for i, header := range []http.Header{
		{"X-Note": {"a\r\nX-Injected: 1"}},
		{"X-Note": {"a\x00b"}},
		{"Bad Name": {"v"}},
		{"": {"v"}},
	} {
		std := "std-" + string(rune('a'+i))
		req, err := http.NewRequestWithContext(idem.WithOperation(bg, std), http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
		require.NoError(t, err)
		for name, values := range header {
			req.Header[name] = values
		}
		_, err = c.StandardClient().Do(req)
		assert.ErrorIs(t, err, idem.ErrInvalidOp, "standard client, header %q", header)

		do := "do-" + string(rune('a'+i))
		_, err = c.Do(bg, idem.Op{ID: do, URL: "/orders", Header: header, Body: []byte(`{}`)})
		assert.ErrorIs(t, err, idem.ErrInvalidOp, "Do, header %q", header)

		for _, id := range []string{std, do} {
			_, err := j.Lookup(bg, "default", id)
			assert.ErrorIs(t, err, idem.ErrNotFound, "nothing journaled for %s", id)
		}
	}
	assert.Zero(t, hits.Load(), "nothing sent")
}

// Calls for one operation that run at the same time share one attempt,
// but only when they are the same request: one with another body (another
// amount, say) is ErrFingerprintMismatch, as it is when it comes after,
// and never told that the first caller's request is its own answer.
func TestConcurrentCallWithAnotherRequestIsAFingerprintMismatch(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	entered := make(chan struct{})
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			close(entered)
		}
		<-release
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
	bg := context.Background()
	pay := func(amount string) error {
		req, err := http.NewRequestWithContext(idem.WithOperation(bg, "pay/1"), http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":`+amount+`}`))
		require.NoError(t, err)
		resp, err := c.StandardClient().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	first := make(chan error, 1)
	go func() { first <- pay("100") }()
	<-entered
	const others = 8
	errs := make(chan error, 2*others)
	for i := range others {
		go func() { errs <- pay("999" + strconv.Itoa(i)) }()
		go func() {
			_, err := c.Do(bg, idem.Op{ID: "pay/1", URL: "/payments", Body: []byte(`{"amount":-` + strconv.Itoa(i) + `}`)})
			errs <- err
		}()
	}
	// Let the other calls join the first one's attempt; arriving later
	// they meet the journaled record instead, which is the same promise.
	time.Sleep(100 * time.Millisecond)
	close(release)
	require.NoError(t, <-first)
	for range 2 * others {
		assert.ErrorIs(t, <-errs, idem.ErrFingerprintMismatch)
	}
	assert.EqualValues(t, 1, hits.Load())
}

// The GET that net/http's client sends to follow an operation's 303 to
// another origin passes through the RoundTripper, and must not carry the
// call's credentials there: net/http drops Authorization only for another
// host name (not another port or scheme), and a Config.SecretHeaders
// header never.
func TestRedirectReadToAnotherOriginCarriesNoCredentials(t *testing.T) {
	t.Parallel()
	type seen struct{ auth, apiKey, proxy string }
	var mu sync.Mutex
	var elsewhere []seen
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		elsewhere = append(elsewhere, seen{r.Header.Get("Authorization"), r.Header.Get("X-Api-Key"), r.Header.Get("Proxy-Authorization")})
		mu.Unlock()
		_, _ = io.WriteString(w, "receipt")
	}))
	t.Cleanup(other.Close)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/receipt" {
			_, _ = io.WriteString(w, "receipt here")
			return
		}
		w.Header().Set("Location", r.URL.Query().Get("to"))
		w.WriteHeader(http.StatusSeeOther)
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), SecretHeaders: []string{"X-Api-Key"}})
	bg := context.Background()
	clients := map[string]*http.Client{"standard": c.StandardClient(), "own": {Transport: c.RoundTripper()}}
	for name, hc := range clients {
		for _, to := range []string{other.URL + "/receipt", srv.URL + "/receipt"} {
			req, err := http.NewRequestWithContext(idem.WithOperation(bg, name+to), http.MethodPost, srv.URL+"/pay?to="+url.QueryEscape(to), strings.NewReader(`{}`))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer call-token")
			req.Header.Set("Proxy-Authorization", "Basic proxy")
			req.Header.Set("X-Api-Key", "api-secret")
			resp, err := hc.Do(req)
			require.NoError(t, err, name)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Contains(t, string(b), "receipt", "%s client followed the 303 to %s", name, to)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []seen{{}, {}}, elsewhere, "no credential went to another origin")
}
