package idem_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// rebuildingTransport sends each request as a new one built from it, as
// many signing and proxying RoundTrippers do: the same method, URL, headers
// and body, under a context of its own. The request is sent all the same;
// only net/http's trace of the original (httptrace) no longer sees it.
type rebuildingTransport struct{ base http.RoundTripper }

func (t rebuildingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var body io.Reader
	if req.Body != nil {
		body = req.Body
	}
	out, err := http.NewRequestWithContext(context.Background(), req.Method, req.URL.String(), body)
	if err != nil {
		return nil, err
	}
	out.Header = req.Header.Clone()
	out.ContentLength = req.ContentLength
	return t.base.RoundTrip(out)
}

// ErrNotSent means "the request certainly did not take effect", and a
// pending operation one that is "provably never left". Config.HTTPClient
// may supply any transport; whether the request was written is read from
// net/http's trace, and when a transport's requests are not traced, no
// trace is read as "nothing was written". Here every write reaches the
// server, which applies it and drops the connection: the outcome is
// unknown, yet Do reports ErrNotSent and leaves the operation pending,
// without a retention clock, as if the server had never seen its key.
func TestAnUntracedTransportsLostAnswerIsNotNotSent(t *testing.T) {
	t.Parallel()
	var writes atomic.Int32
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		writes.Add(1)
		dropConn(w) // applied; the answer is lost
	})
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(),
		HTTPClient: &http.Client{Transport: rebuildingTransport{base: http.DefaultTransport}}})
	ctx := context.Background()
	_, err := c.Do(ctx, orderOp("op-1", 1))
	require.Error(t, err)
	require.Positive(t, writes.Load())
	assert.NotErrorIs(t, err, idem.ErrNotSent, "%d write(s) reached the server", writes.Load())
	assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	rec, err := c.Lookup(ctx, "default", "op-1")
	require.NoError(t, err)
	assert.NotEqual(t, idem.StatePending, rec.State, "journaled as never sent after %d write(s) reached the server", writes.Load())
}

// passingTransport hands each request on as it is, as a logging or
// metering RoundTripper does: net/http traces it.
type passingTransport struct{ base http.RoundTripper }

func (t passingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.base.RoundTrip(req)
}

// The other side of the rule above: a transport that is not net/http's
// own but hands the attempt's request on keeps "not sent" for what the
// trace saw was never written, a dial nothing answered.
func TestATracedTransportsRefusedDialIsNotSent(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there now: every dial is refused
	c, _ := newClient(t, idem.Config{BaseURL: url, Retry: fastRetry(),
		HTTPClient: &http.Client{Transport: passingTransport{base: http.DefaultTransport}}})
	ctx := context.Background()
	_, err := c.Do(ctx, orderOp("op-1", 1))
	require.ErrorIs(t, err, idem.ErrNotSent)
	rec, err := c.Lookup(ctx, "default", "op-1")
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, rec.State)
	assert.Contains(t, rec.LastError, "refused")
}
