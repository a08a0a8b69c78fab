package idem_test

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A BaseURL on an IPv6 link-local address names its zone, percent-encoded
// in the URL ("http://[fe80::1%25eth0]:8080", RFC 6874). Resume takes up
// the operations whose URL starts with BaseURL's origin, built from the
// parsed host, in which the zone is decoded ("[fe80::1%eth0]"), while Do
// journals the URL encoded ("%25eth0"): the client that sent the
// operation never takes it up; its outcome unknown, it is left behind for
// good (background resume included).
func TestResumeTakesUpAnOperationOfAnIPv6BaseURLWithAZone(t *testing.T) {
	t.Parallel()
	var lose atomic.Bool
	lose.Store(true)
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		if lose.Load() {
			dropConn(w) // applied, the answer lost: unknown
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	dial := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Listener.Addr().String()) // the address below is this server
	}}}
	c, j := newClient(t, idem.Config{BaseURL: "http://[fe80::1%25eth0]:8080", HTTPClient: dial, Retry: fastRetry()})
	ctx := context.Background()
	_, err := c.Do(ctx, orderOp("op-1", 1))
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	lose.Store(false)
	rep, err := c.Resume(ctx, idem.ResumeWait())
	require.NoError(t, err)
	rec, err := j.Lookup(ctx, "default", "op-1")
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Claimed, "Resume of the client that sent it, the operation journaled as %s: %+v", rec.URL, rep)
	assert.Equal(t, idem.StateSucceeded, rec.State)
}
