package idem_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// An SDK that spells BaseURL's origin with its default port (":443" for
// https, ":80" for http), or BaseURL that does, names the same origin
// (RFC 6454): its request is the operation, journaled in the origin's
// canonical spelling (no default port), as every worker's Do journals it
// whatever its BaseURL's spelling, so that Resume knows it as its
// origin's, not refused as going elsewhere.
func TestStandardClientDefaultPortIsTheSameOrigin(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	dial := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, srv.Listener.Addr().String()) // the names below are this server
	}}}
	for i, tc := range []struct{ base, url, journaled string }{
		{"http://api.example.test", "http://API.example.test:80/orders", "http://api.example.test/orders"},
		{"http://api.example.test:80/v1/", "http://api.example.test/orders", "http://api.example.test/orders"},
	} {
		c, j := newClient(t, idem.Config{BaseURL: tc.base, HTTPClient: dial, Retry: fastRetry()})
		id := "order-" + string(rune('a'+i))
		req, err := http.NewRequestWithContext(idem.WithOperation(context.Background(), id), http.MethodPost, tc.url, strings.NewReader(`{}`))
		require.NoError(t, err)
		resp, err := c.StandardClient().Do(req)
		require.NoError(t, err, "BaseURL %s, request %s", tc.base, tc.url)
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		rec, err := j.Lookup(context.Background(), "default", id)
		require.NoError(t, err)
		assert.Equal(t, tc.journaled, rec.URL)
	}
}

// A header set under two spellings of one name (an SDK writing
// req.Header["x-trace"] beside req.Header.Set("X-Trace", …)) goes on the
// wire from net/http as two lines, which the server reads as one header
// with both values, in the order of the names. The journal keeps both, in
// that order, and so does every send: not one of them, chosen at random
// by map order. Credentials alike.
func TestStandardClientKeepsEverySpellingOfAHeader(t *testing.T) {
	t.Parallel()
	type got struct{ trace, auth []string }
	var seen []got
	var mu sync.Mutex
	srv := newScripted(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, got{r.Header.Values("X-Trace"), r.Header.Values("Authorization")})
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
	for i := range 8 { // map order differs from call to call
		id := fmt.Sprintf("op-%d", i)
		req, err := http.NewRequestWithContext(idem.WithOperation(context.Background(), id), http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header["x-trace"] = []string{"b"}
		req.Header["X-Trace"] = []string{"a"}
		req.Header["authorization"] = []string{"Bearer 2"}
		req.Header["Authorization"] = []string{"Bearer 1"}
		resp, err := c.StandardClient().Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		rec, err := j.Lookup(context.Background(), "default", id)
		require.NoError(t, err)
		assert.Equal(t, []string{"a", "b"}, rec.Header.Values("X-Trace"), "journaled, call %d", i)
		assert.Empty(t, rec.Header.Values("Authorization"))
	}
	mu.Lock()
	defer mu.Unlock()
	for i, g := range seen {
		assert.Equal(t, []string{"a", "b"}, g.trace, "sent, call %d", i)
		assert.Equal(t, []string{"Bearer 1", "Bearer 2"}, g.auth, "sent, call %d", i)
	}
}

// A call's own credentials override Authorize's (RoundTripper's doc),
// whatever spelling Authorize wrote them under: an Authorize that sets
// r.Header["authorization"] must not put a second Authorization beside
// the call's on the wire, where which one a server reads is its choice.
func TestStandardClientCallCredentialsOverrideEverySpelling(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got [][]string
	srv := newScripted(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Values("Authorization"))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), Authorize: func(r *http.Request) error {
		r.Header["authorization"] = []string{"Bearer from-authorize"}
		return nil
	}})
	req, err := http.NewRequestWithContext(idem.WithOperation(context.Background(), "order-1"), http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer from-the-call")
	resp, err := c.StandardClient().Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, [][]string{{"Bearer from-the-call"}}, got)
}
