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

// An absolute Op.URL may spell BaseURL's origin another way: the host in
// capitals, or the scheme's default port written out (RFC 6454: the same
// origin). The standard client journals such a request as BaseURL spells
// its origin, "so that Resume knows it as its origin's"; Do journals the
// Op.URL as given, and Resume, which drives the operations whose URL
// starts with BaseURL's origin as BaseURL spells it, never takes it up:
// an operation whose outcome is unknown is left behind by the very client
// that sent it, for good (background resume included).
func TestResumeTakesUpAnOperationOfItsOriginSpelledAnotherWay(t *testing.T) {
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
		return d.DialContext(ctx, network, srv.Listener.Addr().String()) // every name below is this server
	}}}
	for _, url := range []string{
		"http://API.example.test/orders",    // the host in capitals
		"http://api.example.test:80/orders", // the default port written out
	} {
		t.Run(url, func(t *testing.T) {
			lose.Store(true)
			c, _ := newClient(t, idem.Config{BaseURL: "http://api.example.test", HTTPClient: dial, Retry: fastRetry()})
			ctx := context.Background()
			op := orderOp("op-1", 1)
			op.URL = url
			_, err := c.Do(ctx, op)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			lose.Store(false)
			rep, err := c.Resume(ctx, idem.ResumeWait())
			require.NoError(t, err)
			assert.Equal(t, 1, rep.Claimed, "Resume of the client that sent it: %+v", rep)
			rec, err := c.Lookup(ctx, "default", "op-1")
			require.NoError(t, err)
			assert.Equal(t, idem.StateSucceeded, rec.State, "journaled URL %s", rec.URL)
		})
	}
}

// A build that journaled Op.URL as given fingerprinted that spelling: the
// same Op, sent again after the upgrade, is the operation it journaled,
// not another request under its ID (ErrFingerprintMismatch). Do finishes
// it with its key; Begin returns it.
func TestAnOperationJournaledWithTheOriginAsGivenIsTheSameOperation(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	dial := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, srv.Listener.Addr().String())
	}}}
	c, j := newClient(t, idem.Config{BaseURL: "http://api.example.test", HTTPClient: dial, Retry: fastRetry()})
	ctx := context.Background()
	ops := map[string]idem.Op{}
	for _, id := range []string{"op-do", "op-begin"} {
		op := orderOp(id, 1)
		op.URL = "http://API.example.test:80/orders"
		ops[id] = op
		_, _, err := j.Create(ctx, idem.Record{Key: "key-" + id, Scope: "default", ID: id, Method: "POST", URL: op.URL,
			Header: op.Header, Body: op.Body, Fingerprint: idem.Fingerprint("POST", op.URL, op.Header, nil, op.Body),
			KeyHeader: "Idempotency-Key", State: idem.StatePending})
		require.NoError(t, err)
	}
	res, err := c.Do(ctx, ops["op-do"])
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, res.State)
	assert.Equal(t, []string{"key-op-do"}, srv.received(), "the journaled operation, sent with its key")
	o, err := c.Begin(ctx, ops["op-begin"])
	require.NoError(t, err)
	assert.Equal(t, "key-op-begin", o.Key())
}
