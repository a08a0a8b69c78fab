package idem_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
)

// postOrder builds the POST an SDK would: JSON, its own credentials, and,
// when sdkKey is set, an Idempotency-Key of its own.
func postOrder(t *testing.T, ctx context.Context, base, body, sdkKey string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/orders", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sdk-token")
	if sdkKey != "" {
		req.Header.Set("Idempotency-Key", sdkKey)
	}
	return req
}

// journalBytes is everything the journal's files hold.
func journalBytes(t *testing.T, dir string) []byte {
	t.Helper()
	var all []byte
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		all = append(all, b...)
	}
	return all
}

func requireURLError(t *testing.T, err error) {
	t.Helper()
	var ue *url.Error
	require.ErrorAs(t, err, &ue, "http.Client wraps the transport's error in a *url.Error")
}

// A request whose context names an operation is journaled (in_flight,
// with its key, without its credentials or the SDK's key) before the
// server sees it, and its answer is an ordinary *http.Response.
func TestStandardClientJournalsBeforeSending(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	j := openJournal(t, filepath.Join(dir, "ops.db"))
	type seen struct {
		key, auth string
		rec       idem.Record
		err       error
	}
	var mu sync.Mutex
	var hits []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec, err := j.Lookup(r.Context(), "default", "checkout/cart-1")
		mu.Lock()
		hits = append(hits, seen{r.Header.Get("Idempotency-Key"), r.Header.Get("Authorization"), rec, err})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Order", "ord_1")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"order_id":"ord_1"}`)
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry()})
	std := c.StandardClient()
	ctx := idem.WithOperation(context.Background(), "checkout/cart-1")
	body := `{"item":"book","quantity":1}`

	resp, err := std.Do(postOrder(t, ctx, srv.URL, body, "sdk-key-1"))
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, "201 Created", resp.Status)
	assert.Equal(t, `{"order_id":"ord_1"}`, string(got))
	assert.Equal(t, "ord_1", resp.Header.Get("X-Order"), "the server's headers")
	res, ok := idem.ResultOf(resp)
	require.True(t, ok)
	assert.False(t, res.Journaled)

	require.Len(t, hits, 1)
	h := hits[0]
	require.NoError(t, h.err, "the operation was journaled before the server saw it")
	assert.Equal(t, idem.StateInFlight, h.rec.State)
	assert.Equal(t, h.rec.Key, h.key, "the journaled key, on the wire")
	assert.Equal(t, res.Key, h.key)
	assert.NotEqual(t, "sdk-key-1", h.key, "the operation's key replaces the SDK's")
	assert.Equal(t, "Bearer sdk-token", h.auth, "the request's credentials went with the attempt")
	assert.Equal(t, body, string(h.rec.Body))
	assert.Equal(t, srv.URL+"/orders", h.rec.URL)
	assert.Equal(t, "application/json", h.rec.Header.Get("Content-Type"))
	assert.Empty(t, h.rec.Header.Values("Authorization"), "credentials are never journaled")
	assert.Empty(t, h.rec.Header.Values("Idempotency-Key"), "the SDK's key is not journaled")

	// The same request again: the journaled answer, nothing sent.
	again, err := std.Do(postOrder(t, ctx, srv.URL, body, "sdk-key-2"))
	require.NoError(t, err)
	defer again.Body.Close()
	res2, ok := idem.ResultOf(again)
	require.True(t, ok)
	assert.True(t, res2.Journaled)
	assert.Equal(t, res.Key, res2.Key)
	assert.Len(t, hits, 1, "a settled operation is not sent again")

	require.NoError(t, c.Close())
	require.NoError(t, j.Close())
	assert.False(t, bytes.Contains(journalBytes(t, dir), []byte("sdk-token")), "a credential reached the journal's files")
	assert.False(t, bytes.Contains(journalBytes(t, dir), []byte("sdk-key-1")), "the SDK's key reached the journal's files")
}

// A lost answer is settled by a status check, which carries the call's
// credentials (the status endpoint requires them: no Config.Authorize is
// set), and comes back as the server's response with the replay mark.
func TestStandardClientSettlesALostAnswer(t *testing.T) {
	t.Parallel()
	for _, checker := range []string{"status endpoint", "replay"} {
		t.Run(checker, func(t *testing.T) {
			t.Parallel()
			srv := testserver.Start(t, testserver.WithWrap(func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Header.Get("Authorization") != "Bearer sdk-token" {
						w.WriteHeader(http.StatusForbidden)
						return
					}
					next.ServeHTTP(w, r)
				})
			}))
			srv.Inject(testserver.DropAfterCommit)
			c, _ := acceptanceClient(t, srv, func(cfg *idem.Config) {
				if checker == "replay" {
					cfg.Status = idem.ReplayStatus()
				}
			})
			ctx := idem.WithOperation(context.Background(), "checkout/cart-2")
			resp, err := c.StandardClient().Do(postOrder(t, ctx, srv.URL, `{"item":"book","quantity":1}`, ""))
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			assert.Equal(t, "ord_1", orderID(t, body))
			assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"), "the replay mark")
			res, ok := idem.ResultOf(resp)
			require.True(t, ok)
			assert.True(t, res.Replayed)
			assert.Equal(t, 1, srv.TotalOrders())
			allSame(t, srv.KeysSeen(), res.Key)
		})
	}
}

// What is not a definitive answer is an error that errors.Is matches with
// idem's sentinels through http.Client's *url.Error.
func TestStandardClientErrors(t *testing.T) {
	t.Parallel()
	drop := func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body); dropConn(w) }
	policy := fastRetry()
	policy.MaxAttempts, policy.MaxStatusChecks = 2, 2

	t.Run("outcome unknown", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(drop))
		t.Cleanup(srv.Close)
		c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy})
		ctx := idem.WithOperation(context.Background(), "op")
		_, err := c.StandardClient().Do(postOrder(t, ctx, srv.URL, `{}`, ""))
		requireURLError(t, err)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		rec, lerr := j.Lookup(context.Background(), "default", "op")
		require.NoError(t, lerr)
		assert.Equal(t, idem.StateUnknown, rec.State, "journaled, for Resume")
	})
	t.Run("not sent", func(t *testing.T) {
		t.Parallel()
		down := downURL(t)
		c, _ := newClient(t, idem.Config{BaseURL: down, Retry: policy})
		ctx := idem.WithOperation(context.Background(), "op")
		_, err := c.StandardClient().Do(postOrder(t, ctx, down, `{}`, ""))
		requireURLError(t, err)
		require.ErrorIs(t, err, idem.ErrNotSent)
	})
	t.Run("fingerprint mismatch", func(t *testing.T) {
		t.Parallel()
		var hits atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			w.WriteHeader(http.StatusCreated)
		}))
		t.Cleanup(srv.Close)
		c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy})
		std := c.StandardClient()
		ctx := idem.WithOperation(context.Background(), "op")
		resp, err := std.Do(postOrder(t, ctx, srv.URL, `{"quantity":1}`, ""))
		require.NoError(t, err)
		resp.Body.Close()
		_, err = std.Do(postOrder(t, ctx, srv.URL, `{"quantity":2}`, ""))
		requireURLError(t, err)
		require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
		assert.EqualValues(t, 1, hits.Load(), "the other request was not sent")
	})
	t.Run("canceled", func(t *testing.T) {
		t.Parallel()
		var hits atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
		t.Cleanup(srv.Close)
		c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy})
		bg := context.Background()
		op, err := c.Begin(bg, idem.Op{ID: "op", URL: "/orders", Body: []byte(`{}`)})
		require.NoError(t, err)
		require.NoError(t, c.Cancel(bg, op.Key()))
		_, err = c.StandardClient().Do(postOrder(t, idem.WithOperation(bg, "op"), srv.URL, `{}`, ""))
		requireURLError(t, err)
		require.ErrorIs(t, err, idem.ErrCanceled)
		assert.Zero(t, hits.Load())
	})
	t.Run("expired", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(drop))
		t.Cleanup(srv.Close)
		c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy, Retention: 20 * time.Millisecond})
		std := c.StandardClient()
		ctx := idem.WithOperation(context.Background(), "op")
		_, err := std.Do(postOrder(t, ctx, srv.URL, `{}`, ""))
		require.Error(t, err)
		time.Sleep(30 * time.Millisecond) // past the retention
		_, err = std.Do(postOrder(t, ctx, srv.URL, `{}`, ""))
		requireURLError(t, err)
		require.ErrorIs(t, err, idem.ErrNeedsReconciliation)
	})
	t.Run("settled without a response", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(drop))
		t.Cleanup(srv.Close)
		c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy})
		std := c.StandardClient()
		ctx := idem.WithOperation(context.Background(), "op")
		_, err := std.Do(postOrder(t, ctx, srv.URL, `{}`, ""))
		var oe *idem.OperationError
		require.ErrorAs(t, err, &oe)
		require.NoError(t, c.Reconcile(context.Background(), oe.Key, idem.StateSucceeded, "order found in the ERP"))
		_, err = std.Do(postOrder(t, ctx, srv.URL, `{}`, ""))
		requireURLError(t, err)
		require.ErrorIs(t, err, idem.ErrNoResponse)
	})
	// The context ending, or the deprecated Request.Cancel channel closing,
	// ends the call; the operation stays journaled.
	for _, how := range []string{"context", "Request.Cancel"} {
		t.Run("interrupted by "+how, func(t *testing.T) {
			t.Parallel()
			arrived := make(chan struct{}, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				arrived <- struct{}{}
				<-r.Context().Done()
			}))
			t.Cleanup(srv.Close)
			c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy, AttemptTimeout: time.Minute})
			ctx, cancel := context.WithCancel(idem.WithOperation(context.Background(), "op"))
			defer cancel()
			req := postOrder(t, ctx, srv.URL, `{}`, "")
			ch := make(chan struct{})
			if how == "Request.Cancel" {
				req = postOrder(t, idem.WithOperation(context.Background(), "op"), srv.URL, `{}`, "")
				req.Cancel = ch //nolint:staticcheck // the deprecated channel is what is tested
			}
			go func() {
				<-arrived
				if how == "context" {
					cancel()
				} else {
					close(ch)
				}
			}()
			_, err := c.StandardClient().Do(req)
			requireURLError(t, err)
			require.ErrorIs(t, err, context.Canceled)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "it was written: maybe applied")
			rec, lerr := j.Lookup(context.Background(), "default", "op")
			require.NoError(t, lerr)
			assert.True(t, rec.State.Active(), "still journaled for Resume: %s", rec.State)
		})
	}
}

// A rejection is a response, as net/http returns a 4xx, and it is the
// operation's answer from then on.
func TestStandardClientRejectionIsAResponse(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":"card_declined"}`)
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
	std := c.StandardClient()
	ctx := idem.WithOperation(context.Background(), "pay/invoice-7")
	for range 2 {
		resp, err := std.Do(postOrder(t, ctx, srv.URL, `{"amount":100}`, ""))
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Equal(t, `{"error":"card_declined"}`, string(body))
		res, ok := idem.ResultOf(resp)
		require.True(t, ok)
		assert.Equal(t, idem.StateRejected, res.State)
	}
	assert.EqualValues(t, 1, hits.Load(), "a rejected operation is never sent again")
}

// A request whose context names no operation is passed through untouched,
// or refused when it is a write and the transport is told to.
func TestStandardClientUnnamedRequests(t *testing.T) {
	t.Parallel()
	var log hitLog
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.add(r)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), Authorize: bearer("config-token")})
	bg := context.Background()

	resp, err := c.StandardClient().Do(postOrder(t, bg, srv.URL, `{}`, ""))
	require.NoError(t, err)
	resp.Body.Close()
	_, isOp := idem.ResultOf(resp)
	assert.False(t, isOp)
	hits := log.all()
	require.Len(t, hits, 1)
	assert.Empty(t, hits[0].IdemKey, "no key added")
	assert.Equal(t, "Bearer sdk-token", hits[0].Auth, "untouched: Authorize does not run")
	counts, err := j.Count(bg)
	require.NoError(t, err)
	assert.Empty(t, counts, "nothing journaled under a made-up ID")

	strict := c.StandardClient(idem.RefuseUnnamedWrites())
	_, err = strict.Do(postOrder(t, bg, srv.URL, `{}`, ""))
	requireURLError(t, err)
	require.ErrorIs(t, err, idem.ErrInvalidOp)
	assert.Contains(t, err.Error(), "idem.WithOperation")
	assert.Len(t, log.all(), 1, "the refused write was not sent")
	resp, err = strict.Get(srv.URL + "/orders/1")
	require.NoError(t, err, "reads pass")
	resp.Body.Close()
	assert.Len(t, log.all(), 2)
}

// trackedBody reports whether it was closed.
type trackedBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *trackedBody) Close() error { b.closed.Store(true); return nil }

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk read error") }

// Bad input: a clear error before anything is journaled or sent, and the
// body closed.
func TestStandardClientBadInput(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	t.Cleanup(other.Close)
	j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"), idem.SQLiteMaxBodySize(64))
	c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry()})
	ctx := idem.WithOperation(context.Background(), "op")
	long := strings.Repeat("x", 65)
	for _, tc := range []struct {
		name   string
		method string
		url    string
		body   io.Reader
		length int64 // -1: unknown
		ctx    context.Context
		want   error
		says   string
	}{
		{"GET given an operation", http.MethodGet, srv.URL + "/orders", nil, 0, ctx, idem.ErrInvalidOp, "is a read"},
		{"HEAD given an operation", http.MethodHead, srv.URL + "/orders", nil, 0, ctx, idem.ErrInvalidOp, "is a read"},
		{"body over the journal's limit, length known", http.MethodPost, srv.URL + "/orders", strings.NewReader(long), 65, ctx, idem.ErrBodyTooLarge, "65 bytes, the journal's limit is 64"},
		{"body over the journal's limit, length unknown", http.MethodPost, srv.URL + "/orders", strings.NewReader(long), -1, ctx, idem.ErrBodyTooLarge, "more than 64"},
		{"body that cannot be read", http.MethodPost, srv.URL + "/orders", failingReader{}, -1, ctx, idem.ErrInvalidOp, "disk read error"},
		{"another origin than BaseURL", http.MethodPost, other.URL + "/orders", strings.NewReader("{}"), 2, ctx, idem.ErrInvalidOp, "another origin"},
		{"empty operation ID", http.MethodPost, srv.URL + "/orders", strings.NewReader("{}"), 2, idem.WithOperation(context.Background(), ""), idem.ErrInvalidOp, "empty ID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body *trackedBody
			req, err := http.NewRequestWithContext(tc.ctx, tc.method, tc.url, nil)
			require.NoError(t, err)
			if tc.body != nil {
				body = &trackedBody{Reader: tc.body}
				req.Body, req.ContentLength = body, tc.length
			}
			_, err = c.StandardClient().Do(req)
			requireURLError(t, err)
			require.ErrorIs(t, err, tc.want)
			assert.Contains(t, err.Error(), tc.says)
			if body != nil {
				assert.True(t, body.closed.Load(), "the body was closed")
			}
			counts, err := j.Count(context.Background())
			require.NoError(t, err)
			assert.Empty(t, counts, "nothing journaled")
		})
	}
	assert.Zero(t, hits.Load(), "nothing sent")
}

// sdkCall is what an SDK does: a key of its own per call (when it sets
// one at all), kept across its own retries of that call.
func sdkCall(t *testing.T, std *http.Client, ctx context.Context, base, sdkKey string) (*http.Response, error) {
	var err error
	for range 3 {
		var resp *http.Response
		resp, err = std.Do(postOrder(t, ctx, base, `{"item":"book","quantity":1}`, sdkKey))
		if err == nil {
			return resp, nil
		}
	}
	return nil, err
}

// An SDK that sets its own key, new with every call, and one that sets
// none: on the wire, one key for the operation, the journaled one, before
// and after a restart.
func TestStandardClientSDKKeys(t *testing.T) {
	t.Parallel()
	for _, setsKey := range []bool{true, false} {
		name := "SDK without a key"
		if setsKey {
			name = "SDK with a key of its own"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := testserver.Start(t)
			path := filepath.Join(t.TempDir(), "ops.db")
			policy := fastRetry()
			policy.MaxAttempts, policy.MaxStatusChecks = 2, 2
			cfg := idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.StatusURL), Retry: policy,
				AttemptTimeout: 2 * time.Second}
			sdkKey := func(call string) string {
				if setsKey {
					return "sdk-" + call
				}
				return ""
			}
			ctx := idem.WithOperation(context.Background(), "checkout/cart-3")

			// The first life: the answer is lost and the status endpoint is
			// down for every check of the SDK's three tries.
			srv.Inject(testserver.DropAfterCommit)
			srv.InjectStatusN(testserver.StatusDown, 6) // 2 checks for each of 3 tries
			j1 := openJournal(t, path)
			c1, err := idem.New(idem.Config{Journal: j1, BaseURL: cfg.BaseURL, Status: cfg.Status, Retry: cfg.Retry, AttemptTimeout: cfg.AttemptTimeout})
			require.NoError(t, err)
			_, err = sdkCall(t, c1.StandardClient(), ctx, srv.URL, sdkKey("call-1"))
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			require.NoError(t, c1.Close())
			require.NoError(t, j1.Close())
			rec, err := openJournal(t, path).Lookup(context.Background(), "default", "checkout/cart-3")
			require.NoError(t, err)

			_, statusFaults := srv.PendingFaults()
			require.Zero(t, statusFaults, "the first life checked the status as often as planned")

			// A restart; the SDK makes a new call, with a new key of its own.
			j2 := openJournal(t, path)
			cfg.Journal = j2
			c2, _ := newClient(t, cfg)
			resp, err := sdkCall(t, c2.StandardClient(), ctx, srv.URL, sdkKey("call-2"))
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, "ord_1", orderID(t, body))
			assert.Equal(t, 1, srv.TotalOrders(), "one order for the logical operation")
			allSame(t, srv.KeysSeen(), rec.Key)
			res, ok := idem.ResultOf(resp)
			require.True(t, ok)
			assert.Equal(t, rec.Key, res.Key, "the key did not change after the restart")
		})
	}
}

// Redirects as net/http follows them, except that an operation's write
// never leaves its origin.
func TestStandardClientRedirects(t *testing.T) {
	t.Parallel()
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(other.Close)
	var log hitLog
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.add(r)
		_, _ = io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/see-other":
			w.Header().Set("Location", "/orders/1")
			w.WriteHeader(http.StatusSeeOther)
		case "/orders/1":
			_, _ = io.WriteString(w, `{"order_id":"ord_1","status":"created"}`)
		case "/moved":
			w.Header().Set("Location", "/orders")
			w.WriteHeader(http.StatusTemporaryRedirect)
		case "/orders":
			w.WriteHeader(http.StatusCreated)
		case "/away":
			w.Header().Set("Location", other.URL+"/orders")
			w.WriteHeader(http.StatusTemporaryRedirect)
		}
	}))
	t.Cleanup(srv.Close)
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
	bg := context.Background()
	post := func(id, path string) *http.Request {
		req, err := http.NewRequestWithContext(idem.WithOperation(bg, id), http.MethodPost, srv.URL+path, strings.NewReader(`{}`))
		require.NoError(t, err)
		return req
	}

	t.Run("303 is followed with a GET that is not the operation", func(t *testing.T) {
		resp, err := c.StandardClient().Do(post("see-other", "/see-other"))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, `{"order_id":"ord_1","status":"created"}`, string(body))
		rec, err := j.Lookup(bg, "default", "see-other")
		require.NoError(t, err)
		assert.Equal(t, idem.StateSucceeded, rec.State)
		assert.Equal(t, http.StatusSeeOther, rec.Response.StatusCode, "the operation's answer is the 303")
		var get *hit
		for _, h := range log.all() {
			if h.Path == "/orders/1" {
				get = &h
			}
		}
		require.NotNil(t, get)
		assert.Equal(t, http.MethodGet, get.Method)
		assert.Empty(t, get.IdemKey, "the GET is a read, not the operation")
	})
	t.Run("307 within the origin is followed with the key", func(t *testing.T) {
		resp, err := c.StandardClient().Do(post("moved", "/moved"))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		res, _ := idem.ResultOf(resp)
		var keys []string
		for _, h := range log.all() {
			if h.Path == "/moved" || h.Path == "/orders" {
				keys = append(keys, h.IdemKey)
			}
		}
		allSame(t, keys, res.Key)
	})
	t.Run("307 to another origin is the answer", func(t *testing.T) {
		resp, err := c.StandardClient().Do(post("away", "/away"))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusTemporaryRedirect, resp.StatusCode)
		// An http.Client of the application's, with the default policy,
		// tries to follow it: the transport refuses to send the write.
		_, err = (&http.Client{Transport: c.RoundTripper()}).Do(post("away", "/away"))
		requireURLError(t, err)
		assert.Contains(t, err.Error(), "another origin")
		assert.Zero(t, elsewhere.Load(), "the write never went to the other origin")
	})
}

// CloseIdleConnections reaches the client's pool, as net/http documents.
func TestStandardClientCloseIdleConnections(t *testing.T) {
	t.Parallel()
	var closed atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closed.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
	std := c.StandardClient()
	resp, err := std.Do(postOrder(t, idem.WithOperation(context.Background(), "op"), srv.URL, `{}`, ""))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Zero(t, closed.Load(), "the connection is kept alive")
	std.CloseIdleConnections()
	require.Eventually(t, func() bool { return closed.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the idle connection was closed")
}

// Requests for one operation from many goroutines put one attempt on the
// wire and each get a response of their own, readable at once.
func TestStandardClientConcurrentCallsShareOneAttempt(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		<-release
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"order_id":"ord_1"}`)
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
	std := c.StandardClient()
	ctx := idem.WithOperation(context.Background(), "checkout/cart-9")
	const callers = 8
	var wg sync.WaitGroup
	bodies := make([]string, callers)
	headers := make([]http.Header, callers)
	results := make([]*idem.Result, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := std.Do(postOrder(t, ctx, srv.URL, `{"item":"book","quantity":1}`, ""))
			if err != nil {
				errs[i] = err
				return
			}
			resp.Header.Set("X-Seen-By", strconv.Itoa(i)) // each response's header is its own
			headers[i] = resp.Header
			results[i], _ = idem.ResultOf(resp)
			b, err := io.ReadAll(resp.Body)
			errs[i] = errors.Join(err, resp.Body.Close())
			bodies[i] = string(b)
		}()
	}
	require.Eventually(t, func() bool { return hits.Load() == 1 }, 10*time.Second, time.Millisecond)
	close(release)
	wg.Wait()
	for i := range callers {
		require.NoError(t, errs[i])
		assert.Equal(t, `{"order_id":"ord_1"}`, bodies[i])
		assert.Equal(t, strconv.Itoa(i), headers[i].Get("X-Seen-By"), "caller %d's header was changed by another", i)
		require.NotNil(t, results[i])
		for j := range i {
			assert.NotSame(t, results[j], results[i], "callers %d and %d share a Result", j, i)
		}
	}
	assert.EqualValues(t, 1, hits.Load(), "one attempt for the operation")
}

// The request's credentials go over Config.Authorize's for this call,
// which still runs (here it adds a tenant header); a later call without
// credentials has Authorize's alone.
func TestStandardClientCallCredentialsOverAuthorize(t *testing.T) {
	t.Parallel()
	type got struct{ auth, tenant string }
	var mu sync.Mutex
	var seen []got
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, got{r.Header.Get("Authorization"), r.Header.Get("X-Tenant")})
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), Authorize: func(r *http.Request) error {
		r.Header.Set("Authorization", "Bearer config-token")
		r.Header.Set("X-Tenant", "acme")
		return nil
	}})
	std := c.StandardClient()
	resp, err := std.Do(postOrder(t, idem.WithOperation(context.Background(), "a"), srv.URL, `{}`, ""))
	require.NoError(t, err)
	resp.Body.Close()
	req := postOrder(t, idem.WithOperation(context.Background(), "b"), srv.URL, `{}`, "")
	req.Header.Del("Authorization")
	resp, err = std.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []got{{"Bearer sdk-token", "acme"}, {"Bearer config-token", "acme"}}, seen)
}

// Credentials are not part of an operation's fingerprint: within one
// scope, an operation ID names one operation whoever calls it, and a call
// with another principal's credentials gets the first call's journaled
// answer without being sent. A client that calls for several principals
// names the principal in the scope (WithScopedOperation): then the same ID
// is two operations, two keys, two requests, each with its own
// credentials.
func TestStandardClientScopeNamesThePrincipal(t *testing.T) {
	t.Parallel()
	type got struct{ auth, key string }
	var mu sync.Mutex
	var seen []got
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, got{r.Header.Get("Authorization"), r.Header.Get("Idempotency-Key")})
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"paid_by":"`+r.Header.Get("Authorization")+`"}`)
	}))
	t.Cleanup(srv.Close)
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
	std := c.StandardClient()
	call := func(ctx context.Context, token string) string {
		req := postOrder(t, ctx, srv.URL, `{"amount":100}`, "")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := std.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(b)
	}

	// One scope: alice's call is the operation; bob's is answered with it.
	assert.JSONEq(t, `{"paid_by":"Bearer alice"}`, call(idem.WithOperation(context.Background(), "pay/1"), "alice"))
	assert.JSONEq(t, `{"paid_by":"Bearer alice"}`, call(idem.WithOperation(context.Background(), "pay/1"), "bob"),
		"in one scope the ID names one operation, whoever calls")
	mu.Lock()
	require.Len(t, seen, 1, "bob's call was answered from the journal, not sent")
	mu.Unlock()

	// A scope per principal: two operations.
	assert.JSONEq(t, `{"paid_by":"Bearer alice"}`, call(idem.WithScopedOperation(context.Background(), "alice", "pay/2"), "alice"))
	assert.JSONEq(t, `{"paid_by":"Bearer bob"}`, call(idem.WithScopedOperation(context.Background(), "bob", "pay/2"), "bob"))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 3)
	assert.Equal(t, "Bearer alice", seen[1].auth)
	assert.Equal(t, "Bearer bob", seen[2].auth)
	assert.NotEqual(t, seen[1].key, seen[2].key, "each principal's operation has a key of its own")
}
