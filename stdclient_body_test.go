package idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// signalReader is a body that says when it is first read.
type signalReader struct {
	io.Reader
	reading chan struct{}
	once    atomic.Bool
}

func (r *signalReader) Read(p []byte) (int, error) {
	if r.once.CompareAndSwap(false, true) {
		close(r.reading)
	}
	return r.Reader.Read(p)
}

// A body that never ends (an SDK streaming from a pipe whose writer
// waits) does not outlive the request's context: as net/http's transport
// does, the RoundTripper closes the body when the context ends, and
// returns the context's error with nothing journaled or sent.
func TestStandardClientBodyReadEndsWithTheContext(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
	c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry()})
	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pw.Close() })
	body := &signalReader{Reader: pr, reading: make(chan struct{})}
	ctx, cancel := context.WithCancel(idem.WithOperation(context.Background(), "order-1"))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", nil)
	require.NoError(t, err)
	req.Body = struct { // closing the pipe is what ends a read of it
		io.Reader
		io.Closer
	}{body, pr}
	done := make(chan error, 1)
	go func() { _, err := c.StandardClient().Do(req); done <- err }()
	<-body.reading
	cancel()
	select {
	case err = <-done:
	case <-time.After(time.Minute): // only a failure waits this long
		t.Fatal("the call still reads the body a minute after its context was canceled")
	}
	require.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, idem.ErrInvalidOp, "the request was good; its context ended")
	assert.Empty(t, srv.received(), "nothing sent")
	counts, err := j.Count(context.Background())
	require.NoError(t, err)
	assert.Empty(t, counts, "nothing journaled")
}

// emptyReads returns 0, nil n times before its body: a reader io.Reader's
// contract discourages, which must not spin the caller for ever.
type emptyReads struct {
	left  atomic.Int64
	calls atomic.Int64
}

func (r *emptyReads) Read(p []byte) (int, error) {
	r.calls.Add(1)
	if r.left.Add(-1) >= 0 {
		return 0, nil
	}
	return 0, io.EOF
}

// A body whose reads return nothing and no error is refused with
// io.ErrNoProgress after as many empty reads as bufio allows, not read for
// as long as it keeps doing so.
func TestStandardClientBodyThatMakesNoProgress(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
	r := &emptyReads{}
	r.left.Store(1 << 20)
	req, err := http.NewRequestWithContext(idem.WithOperation(context.Background(), "order-1"), http.MethodPost, srv.URL+"/orders", r)
	require.NoError(t, err)
	_, err = c.StandardClient().Do(req)
	require.ErrorIs(t, err, idem.ErrInvalidOp)
	require.True(t, errors.Is(err, io.ErrNoProgress), "%v", err)
	assert.LessOrEqual(t, r.calls.Load(), int64(100))
	assert.Empty(t, srv.received())
}

// A request that declares a body it does not have (ContentLength 5, Body
// nil), which net/http's transport refuses, is refused too, before
// anything is journaled: not journaled and sent with an empty body.
func TestStandardClientDeclaredBodyThatIsMissing(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
	c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry()})
	for _, body := range []io.ReadCloser{nil, http.NoBody} {
		req, err := http.NewRequestWithContext(idem.WithOperation(context.Background(), "order-1"), http.MethodPost, srv.URL+"/orders", nil)
		require.NoError(t, err)
		req.Body, req.ContentLength = body, 5
		_, err = c.StandardClient().Do(req)
		require.ErrorIs(t, err, idem.ErrInvalidOp)
		assert.Contains(t, err.Error(), "ContentLength is 5")
	}
	assert.Empty(t, srv.received(), "nothing sent")
	counts, err := j.Count(context.Background())
	require.NoError(t, err)
	assert.Empty(t, counts, "nothing journaled")
}

// The response's Content-Length header says what its body holds: the
// server's when the whole answer was kept, none when Config.MaxResponseBytes
// cut it (an SDK that sizes a buffer by it would wait for bytes that never
// come). The Result keeps the server's header as it came.
func TestStandardClientContentLengthOfACutBody(t *testing.T) {
	t.Parallel()
	const answer = `{"order_id":"ord_1","status":"created"}`
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, answer)
	})
	for _, limit := range []int64{0, 16} {
		c, err := idem.New(idem.Config{Journal: idem.NewMemoryJournal(), BaseURL: srv.URL, MaxResponseBytes: limit})
		require.NoError(t, err)
		ctx := idem.WithOperation(context.Background(), "checkout/cart-1")
		resp, err := c.StandardClient().Do(postOrder(t, ctx, srv.URL, `{}`, ""))
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, resp.Body.Close())
		res, ok := idem.ResultOf(resp)
		require.True(t, ok)
		assert.Equal(t, strconv.Itoa(len(answer)), res.Header.Get("Content-Length"), "the server's header, in the Result")
		if limit == 0 {
			require.NoError(t, err)
			assert.False(t, res.BodyCut)
			assert.Equal(t, int64(len(body)), resp.ContentLength)
			assert.Equal(t, answer, string(body))
			assert.Equal(t, strconv.Itoa(len(answer)), resp.Header.Get("Content-Length"))
		} else {
			// The bytes kept, then the error net/http gives a body that
			// ends early: the reader cannot take them for the answer.
			require.ErrorIs(t, err, io.ErrUnexpectedEOF)
			assert.True(t, res.BodyCut)
			assert.Len(t, body, int(limit), "cut at MaxResponseBytes")
			assert.Equal(t, int64(-1), resp.ContentLength, "unknown: the answer was longer")
			assert.Empty(t, resp.Header.Values("Content-Length"), "no length the body does not have")
		}
		require.NoError(t, c.Close())
	}
}
