package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
	"github.com/idemkit/idem/internal/wire"
)

// sendOther sends, straight to the server and under key, another request
// than the operation's: another body on the same route, as a second client
// or service that reused the key would (with its own journal), or an
// operator replaying a request by hand. The server stores the key for it.
func sendOther(t *testing.T, srv *testserver.Server, key string) []byte {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":"piano","quantity":9}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "the other request: %s", body)
	return body
}

// dropAnswer is a reverse proxy's ErrorHandler that passes on a dropped
// upstream connection as one: the client gets no answer (rather than the
// proxy's 502), so the outcome is unknown, for the status check.
func dropAnswer(http.ResponseWriter, *http.Request, error) { panic(http.ErrAbortHandler) }

// A status answer is about a key; the key may be stored for another
// request than the operation's (another body, target or method). The retry
// path answers that with 422 "Idempotency key reused"; the status path
// must not hand the other request's answer back as the operation's
// result. Here the operation's own attempt meets the key already stored
// for another body (the middleware answers 422, and that answer is lost),
// and the status endpoint then says "completed" with the other request's
// 201: the operation was never applied.
func TestStatusAnswerForAnotherRequestIsNotTaken(t *testing.T) {
	t.Parallel()
	for name, opts := range map[string][]testserver.Option{
		"memory store": nil,
		"sqlite store": {testserver.WithSQLiteStore()},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := testserver.Start(t, opts...)
			c, j := acceptanceClient(t, srv)
			ctx := context.Background()
			op, err := c.Begin(ctx, orderOp("checkout/cart-reused", 1))
			require.NoError(t, err)
			other := sendOther(t, srv, op.Key())
			requests := srv.Requests()

			srv.Inject(testserver.DropAfterCommit)
			res, err := op.Send(ctx)
			if res != nil {
				assert.NotEqual(t, string(other), string(res.Body), "the other request's answer was taken as the operation's")
			}
			require.Error(t, err, "the status endpoint answered for another request; the operation was never applied")
			assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			assert.ErrorIs(t, err, idem.ErrKeyHeldForAnotherRequest)
			assert.NotErrorIs(t, err, idem.ErrRejected, "not a rejection: the key may hold an earlier attempt in a form the client cannot reproduce")
			var oe *idem.OperationError
			require.ErrorAs(t, err, &oe)
			assert.Equal(t, idem.StateUnknown, oe.State)
			assert.Contains(t, err.Error(), "another request")
			assert.Equal(t, requests+1, srv.Requests(), "nothing sent again after the status answer")
			assert.Equal(t, 1, srv.TotalOrders(), "only the other request's order")

			rec, err := j.Get(ctx, op.Key())
			require.NoError(t, err)
			assert.Equal(t, idem.StateUnknown, rec.State, "journaled as the retry path journals a 422 after an attempt that may have been applied")
			assert.Nil(t, rec.Response, "the other request's answer is not journaled as the operation's")
			assert.Contains(t, rec.LastError, "another request")

			// A later call checks again and stops the same way: no re-send,
			// no other request's answer.
			_, err = c.Do(ctx, orderOp("checkout/cart-reused", 1))
			assert.ErrorIs(t, err, idem.ErrKeyHeldForAnotherRequest)
			assert.Contains(t, err.Error(), "another request")
			assert.Equal(t, requests+1, srv.Requests())
		})
	}
}

// An older server's answer, without "fingerprint", settles a genuine
// completion as before.
func TestStatusAnswerWithoutFingerprintStillCompletes(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	target, err := url.Parse(srv.URL)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ErrorHandler = dropAnswer
	answers := 0
	proxy.ModifyResponse = func(resp *http.Response) error {
		if !strings.HasPrefix(resp.Request.URL.Path, "/idempotency/") {
			return nil
		}
		answers++
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		var v map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(body, &v))
		delete(v, "fingerprint")
		body, err = json.Marshal(v)
		require.NoError(t, err)
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	front := httptest.NewServer(proxy)
	t.Cleanup(front.Close)
	c, _ := acceptanceClient(t, srv, func(c *idem.Config) {
		c.BaseURL = front.URL
		c.Status = idem.StatusEndpoint(front.URL + "/idempotency")
	})
	srv.Inject(testserver.DropAfterCommit)
	res, err := c.Do(context.Background(), orderOp("checkout/cart-old-server", 1))
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, res.StatusCode)
	assert.Equal(t, "ord_1", orderID(t, res.Body))
	assert.Equal(t, 1, srv.TotalOrders())
	assert.Equal(t, 1, srv.Requests(), "settled by the status answer, not by a re-send")
	assert.Equal(t, 1, answers, "settled by a status answer without a fingerprint")
}

// A reverse proxy that strips a path prefix (/api) makes the target the
// server fingerprints (/orders) differ from the one the client sent
// (/api/orders): a genuine completion must still settle the operation.
func TestStatusFingerprintThroughPrefixStrippingProxy(t *testing.T) {
	t.Parallel()
	for name, opts := range map[string][]testserver.Option{
		"memory store": nil,
		"sqlite store": {testserver.WithSQLiteStore()},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := testserver.Start(t, opts...)
			target, err := url.Parse(srv.URL)
			require.NoError(t, err)
			proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
				r.SetURL(target)
				r.Out.URL.Path = strings.TrimPrefix(r.In.URL.Path, "/api")
				r.Out.URL.RawPath = ""
			}, ErrorHandler: dropAnswer}
			front := httptest.NewServer(proxy)
			t.Cleanup(front.Close)
			c, _ := acceptanceClient(t, srv, func(c *idem.Config) {
				c.BaseURL = front.URL + "/api"
				c.Status = idem.StatusEndpoint(front.URL + "/api/idempotency")
			})
			ctx := context.Background()
			srv.Inject(testserver.DropAfterCommit)
			res, err := c.Do(ctx, idem.Op{ID: "checkout/cart-proxied", URL: "/api/orders?source=web",
				Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"item":"book","quantity":1}`)})
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, res.StatusCode)
			assert.Equal(t, "ord_1", orderID(t, res.Body))
			assert.True(t, res.Replayed)
			assert.Equal(t, 1, srv.TotalOrders())
			assert.Equal(t, 1, srv.Requests(), "settled by the status answer, not by a re-send")
			assert.Equal(t, 1, srv.StatusRequests())
		})
	}
}

// While the other request under the key is still processed, the status
// answer already says whose it is: the call stops at once, rather than
// wait for the other request's answer it would not take anyway.
func TestStatusProcessingForAnotherRequestStopsAtOnce(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	c, j := acceptanceClient(t, srv)
	ctx := context.Background()
	op, err := c.Begin(ctx, orderOp("checkout/cart-reused-busy", 1))
	require.NoError(t, err)

	// The other request is held in its handler until the server closes.
	srv.Inject(testserver.SlowHandler(time.Hour))
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":"piano","quantity":9}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", op.Key())
		if resp, err := srv.Client().Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool {
		resp, err := srv.Client().Get(srv.StatusURL + "/" + op.Key())
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(body), `"processing"`)
	}, 10*time.Second, 5*time.Millisecond, "the other request holds the key")
	checks := srv.StatusRequests()

	srv.Inject(testserver.DropAfterCommit)
	_, err = op.Send(ctx)
	require.ErrorIs(t, err, idem.ErrKeyHeldForAnotherRequest)
	assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	assert.Equal(t, checks+1, srv.StatusRequests(), "one status check: the answer names another request")
	assert.Equal(t, 2, srv.Requests(), "the other request and the operation's one attempt; nothing sent again")
	rec, err := j.Get(ctx, op.Key())
	require.NoError(t, err)
	assert.Equal(t, idem.StateUnknown, rec.State)
	assert.Equal(t, 0, srv.TotalOrders(), "the other request is still held")
}

// A StatusAdapter whose server gives the fingerprint passes it on: the
// request's own settles, another's stops the call, and one of another
// form is a bad status (compared as it is, it would never match).
func TestStatusAdapterFingerprint(t *testing.T) {
	t.Parallel()
	body := []byte(`{"amount":100}`)
	for name, tc := range map[string]struct {
		fp   string
		want error
	}{
		"the request's":         {wire.RequestFingerprint(http.MethodPost, "/v2/payments", body), nil},
		"another request's":     {wire.RequestFingerprint(http.MethodPost, "/v2/payments", []byte(`{"amount":999}`)), idem.ErrKeyHeldForAnotherRequest},
		"not the server's form": {"md5:0cc175b9c0f1b6a831c399e269772661", idem.ErrBadStatus},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			api := newPayments(t)
			adapter := outcomeAdapter(api.URL)
			decode := adapter.Decode
			adapter.Decode = func(code int, h http.Header, b []byte) (idem.Status, error) {
				st, err := decode(code, h, b)
				st.Fingerprint = tc.fp
				return st, err
			}
			policy := fastRetry()
			policy.MaxStatusChecks = 2
			c, _ := newClient(t, idem.Config{BaseURL: api.URL, Status: adapter, Retry: policy})
			res, err := c.Do(context.Background(), idem.Op{ID: "pay-1", URL: "/v2/payments", Body: body})
			if tc.want == nil {
				require.NoError(t, err)
				assert.JSONEq(t, `{"payment":"pay_1"}`, string(res.Body))
				return
			}
			require.ErrorIs(t, err, tc.want)
			assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			api.mu.Lock()
			defer api.mu.Unlock()
			assert.Equal(t, 1, api.posts, "nothing sent again")
		})
	}
}
