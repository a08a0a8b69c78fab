package idem_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
	"github.com/idemkit/idem/server"
)

// Review 12 (kept after the status fingerprint was withdrawn): a GENUINE
// completion of the operation's own request, whose answer was lost, is
// settled by the status endpoint's answer, however the request reached the
// server: each setup below makes the server see another form of it than
// the journal holds (a query parameter Authorize adds, a decoded body, a
// re-encoded path, a stripped slash, a redirect), and the retry path
// handles each (every attempt reaches the middleware in the same form).
// A fingerprint the client compares with what it journaled left every one
// unknown, "held for another request"; any later design of that check
// must keep these settling.

// assertSettledByStatus checks the call settled the genuine completion
// from the status answer: one order, no re-send, the replayed 201.
func assertSettledByStatus(t *testing.T, srv *testserver.Server, res *idem.Result, err error) {
	t.Helper()
	require.NoError(t, err, "the server holds the operation's own completed answer; the status check must settle it")
	assert.Equal(t, http.StatusCreated, res.StatusCode)
	assert.Equal(t, "ord_1", orderID(t, res.Body))
	assert.Equal(t, 1, srv.TotalOrders())
}

// Config.Authorize may change the URL ("What is sent is the journaled
// request with Authorize's headers, URL and Host"). An API that takes its
// credential as a query parameter (?api_key=…, the same on every request)
// gets it from Authorize. Every attempt carries the same target, so a
// retry replays; the server holds the request as /orders?api_key=…, and
// the journaled request is /orders: a status check that compared the two
// reported the user's completed order as held for another request.
func TestReview12AuthorizeStaticQueryCredentialSettles(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	c, _ := acceptanceClient(t, srv, func(c *idem.Config) {
		c.Authorize = func(r *http.Request) error {
			if strings.HasPrefix(r.URL.Path, "/idempotency/") {
				return nil
			}
			q := r.URL.Query()
			q.Set("api_key", "k_live_static")
			r.URL.RawQuery = q.Encode()
			return nil
		}
	})
	srv.Inject(testserver.DropAfterCommit)
	res, err := c.Do(context.Background(), orderOp("checkout/review12-api-key", 1))
	assertSettledByStatus(t, srv, res, err)
	assert.Equal(t, 1, srv.Requests(), "settled by the status answer, not by a re-send")
}

// A server that decodes a gzip request body in front of the idempotency
// middleware (a common decompression middleware) fingerprints the decoded
// body; the client journaled, and sends, the gzip bytes with
// Content-Encoding: gzip. Each retry decodes the same, so the retry path
// replays; a digest of the decoded body never matches the journaled one.
func TestReview12DecompressingServerCompletionSettles(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t, testserver.WithWrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Content-Encoding") == "gzip" {
				zr, err := gzip.NewReader(r.Body)
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				plain, err := io.ReadAll(zr)
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				r.Body = io.NopCloser(bytes.NewReader(plain))
				r.ContentLength = int64(len(plain))
				r.Header.Del("Content-Encoding")
				r.Header.Del("Content-Length")
			}
			next.ServeHTTP(w, r)
		})
	}))
	c, _ := acceptanceClient(t, srv)
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	_, err := zw.Write([]byte(`{"item":"book","quantity":1}`))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	srv.Inject(testserver.DropAfterCommit)
	res, err := c.Do(context.Background(), idem.Op{ID: "checkout/review12-gzip", URL: "/orders",
		Header: http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"gzip"}}, Body: zb.Bytes()})
	assertSettledByStatus(t, srv, res, err)
	assert.Equal(t, 1, srv.Requests(), "settled by the status answer, not by a re-send")
}

// A prefix-stripping proxy (Path trimmed, RawPath cleared: the path re-encoded in Go's canonical
// form, as nginx's proxy_pass with a URI normalizes it) forwards a path the
// client sent with an escape the canonical form writes otherwise (%7E for
// "~", lowercase hex): the same path by RFC 3986, the same route and the
// same request for the middleware on every retry, in another spelling
// than the journal's.
func TestReview12NormalizingStripProxyCompletionSettles(t *testing.T) {
	t.Parallel()
	for name, path := range map[string]string{
		"%7E for ~":         "/api/files/report%7E2026",
		"lowercase hex":     "/api/files/caf%c3%a9",
		"an escaped letter": "/api/files/%61bc",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			mw, err := server.New(server.Config{Store: server.NewMemoryStore(), Scope: server.SingleTenant})
			require.NoError(t, err)
			t.Cleanup(func() { _ = mw.Close() })
			var runs, drops atomic.Int32
			files := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, `{"file":"`+r.PathValue("name")+`"}`)
			}))
			mux := http.NewServeMux()
			mux.Handle("POST /files/{name}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if drops.Add(1) == 1 {
					files.ServeHTTP(httptest.NewRecorder(), r) // stored, then the answer is lost
					panic(http.ErrAbortHandler)
				}
				files.ServeHTTP(w, r)
			}))
			mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
			back := httptest.NewServer(mux)
			t.Cleanup(back.Close)
			target, err := url.Parse(back.URL)
			require.NoError(t, err)
			front := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
				r.SetURL(target)
				r.Out.URL.Path = strings.TrimPrefix(r.In.URL.Path, "/api")
				r.Out.URL.RawPath = ""
			}, ErrorHandler: dropAnswer})
			t.Cleanup(front.Close)
			c, _ := newClient(t, idem.Config{BaseURL: front.URL, Status: idem.StatusEndpoint(front.URL + "/api/idempotency"),
				Retry: fastRetry()})
			res, err := c.Do(context.Background(), idem.Op{ID: "upload/review12-" + name, URL: path, Body: []byte("contents")})
			require.NoError(t, err, "the server holds the operation's own completed answer; the status check must settle it")
			assert.Equal(t, http.StatusCreated, res.StatusCode)
			assert.Equal(t, int32(1), runs.Load())
			assert.Equal(t, int32(1), drops.Load(), "settled by the status answer, not by a re-send")
		})
	}
}

// A router middleware in front of the idempotency middleware that strips a
// trailing slash (chi's middleware.StripSlashes, a common one) makes the
// server see /orders for the client's /orders/, on every attempt alike: a
// retry replays, and the server holds the request as /orders.
func TestReview12TrailingSlashStrippedCompletionSettles(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t, testserver.WithWrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if p := r.URL.Path; len(p) > 1 && strings.HasSuffix(p, "/") {
				r.URL.Path = strings.TrimSuffix(p, "/")
				r.URL.RawPath = ""
			}
			next.ServeHTTP(w, r)
		})
	}))
	c, _ := acceptanceClient(t, srv)
	srv.Inject(testserver.DropAfterCommit)
	op := orderOp("checkout/review12-trailing-slash", 1)
	op.URL = "/orders/"
	res, err := c.Do(context.Background(), op)
	assertSettledByStatus(t, srv, res, err)
	assert.Equal(t, 1, srv.Requests(), "settled by the status answer, not by a re-send")
}

// The client follows a same-origin 307/308 (documented in
// Config.HTTPClient), and the middleware behind the new target runs the
// request and stores it under that target. Here the redirected request's
// answer is lost twice (net/http's transport replays a keyed request once
// on a reused connection by itself). The status answer is the operation's
// own completion, held under /orders, while the journal has /checkout.
func TestReview12SameOriginRedirectedCompletionSettles(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t, testserver.WithWrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/checkout" {
				http.Redirect(w, r, "/orders", http.StatusPermanentRedirect)
				return
			}
			next.ServeHTTP(w, r)
		})
	}))
	c, _ := acceptanceClient(t, srv)
	srv.InjectN(testserver.DropAfterCommit, 2)
	op := orderOp("checkout/review12-redirect", 1)
	op.URL = "/checkout"
	res, err := c.Do(context.Background(), op)
	assertSettledByStatus(t, srv, res, err)
}

// dropAnswer makes a reverse proxy's failure to reach the server an
// aborted answer: the client sees the connection cut, the outcome unknown.
func dropAnswer(http.ResponseWriter, *http.Request, error) { panic(http.ErrAbortHandler) }
