package idem_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// An SDK that spells BaseURL's origin with its default port (":443" for
// https, ":80" for http), or BaseURL that does, names the same origin
// (RFC 6454): its request is the operation, journaled as BaseURL spells
// it so that Resume knows it as its origin's, not refused as going
// elsewhere.
func TestStandardClientDefaultPortIsTheSameOrigin(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	dial := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, srv.Listener.Addr().String()) // the names below are this server
	}}}
	for i, tc := range []struct{ base, url, journaled string }{
		{"http://api.example.test", "http://API.example.test:80/orders", "http://api.example.test/orders"},
		{"http://api.example.test:80/v1/", "http://api.example.test/orders", "http://api.example.test:80/orders"},
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
