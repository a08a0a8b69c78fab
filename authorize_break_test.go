package idem_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// signBody is an Authorize that signs the body, as request-signing APIs
// require: it reads the body and puts it back, as net/http code does.
func signBody(r *http.Request) error {
	var b []byte
	if r.Body != nil {
		var err error
		if b, err = io.ReadAll(r.Body); err != nil {
			return err
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
	}
	m := hmac.New(sha256.New, []byte("signing-secret"))
	m.Write(b)
	r.Header.Set("X-Signature", hex.EncodeToString(m.Sum(nil)))
	return nil
}

func signatureOf(b []byte) string {
	m := hmac.New(sha256.New, []byte("signing-secret"))
	m.Write(b)
	return hex.EncodeToString(m.Sum(nil))
}

// An Authorize that reads the body to sign it (and puts it back) must not
// take it from the request that is sent: every send, the first, a retry,
// a status check's replay and a Resume's, carries the journaled body and
// its signature.
func TestAuthorizeThatReadsTheBodySendsTheBody(t *testing.T) {
	t.Parallel()
	const body = `{"item":"book","quantity":1}`
	for _, path := range []string{"retry", "replay", "resume"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var bodies, sigs []string
			srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				bodies = append(bodies, string(b))
				sigs = append(sigs, r.Header.Get("X-Signature"))
				mu.Unlock()
				switch {
				case n == 1 && path == "retry":
					w.WriteHeader(http.StatusServiceUnavailable)
				case n == 1:
					dropConn(w)
				default:
					w.WriteHeader(http.StatusCreated)
				}
			})
			policy := fastRetry()
			if path != "retry" {
				policy.MaxAttempts = 1
			}
			cfg := idem.Config{BaseURL: srv.URL, Retry: policy, Authorize: signBody}
			c, _ := newClient(t, cfg)
			ctx := context.Background()
			if path == "resume" {
				// A pending operation: Resume's first send, then its replay.
				_, err := c.Begin(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(body)})
				require.NoError(t, err)
				_, err = c.Resume(ctx)
				require.NoError(t, err)
			} else {
				req, err := http.NewRequestWithContext(idem.WithOperation(ctx, "order-1"), http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
				require.NoError(t, err)
				resp, err := c.StandardClient().Do(req)
				require.NoError(t, err)
				require.NoError(t, resp.Body.Close())
			}
			mu.Lock()
			defer mu.Unlock()
			require.GreaterOrEqual(t, len(bodies), 2)
			for i := range bodies {
				assert.Equal(t, body, bodies[i], "send %d carries the journaled body", i+1)
				assert.Equal(t, signatureOf([]byte(body)), sigs[i], "send %d is signed over its body", i+1)
			}
		})
	}
}

// Authorize runs within the attempt's bound (Config.AttemptTimeout), as it
// did when the transport ran it: a token fetch that hangs must not hold an
// operation, and its lease, for ever when the caller gave no deadline (a
// background Resume gives none).
func TestAuthorizeIsBoundedByAttemptTimeout(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	var mu sync.Mutex
	var bounded []bool
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), AttemptTimeout: time.Minute,
		Authorize: func(r *http.Request) error {
			d, ok := r.Context().Deadline()
			mu.Lock()
			bounded = append(bounded, ok && time.Until(d) <= time.Minute)
			mu.Unlock()
			return nil
		}})
	_, err := c.Do(context.Background(), idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, bounded)
	for i, b := range bounded {
		assert.True(t, b, "Authorize %d runs under AttemptTimeout", i+1)
	}
}

// An Authorize that changes the body (compresses or encrypts it) cannot
// have its way: what is sent is the journaled body, and sending it with
// Authorize's headers (Content-Encoding: gzip over a plain body) would be
// a request nobody made. It is refused as Authorize's failure, nothing
// sent, rather than sent as such.
func TestAuthorizeThatChangesTheBodyIsRefused(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), Authorize: func(r *http.Request) error {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		_, _ = zw.Write(b)
		_ = zw.Close()
		r.Body, r.ContentLength = io.NopCloser(&gz), int64(gz.Len())
		r.Header.Set("Content-Encoding", "gzip")
		return nil
	}})
	ctx := context.Background()
	_, err := c.Do(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{"item":"book"}`)})
	require.ErrorIs(t, err, idem.ErrAuthorizeFailed)
	assert.Contains(t, err.Error(), "changed the request's body")
	var oe *idem.OperationError
	require.ErrorAs(t, err, &oe)
	assert.Zero(t, oe.Attempts, "nothing was sent")
	assert.Empty(t, srv.received(), "nothing sent")
	rec, err := j.Lookup(ctx, "default", "order-1")
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, rec.State)
}

// Authorize is told which operation a request is for (OperationFrom), key
// included, and runs for a request that is to be sent. A second Do of a
// settled operation sends nothing; today it still runs Authorize, on a
// request carrying a freshly minted key that is never the operation's
// (the first send is authorized before Create says whether the operation
// exists, so that a failing Authorize journals no attempt).
func TestAuthorizeSeesOnlyTheOperationsKey(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	var mu sync.Mutex
	var keys []string
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), Authorize: func(r *http.Request) error {
		info, _ := idem.OperationFrom(r.Context())
		mu.Lock()
		keys = append(keys, info.Key)
		mu.Unlock()
		return nil
	}})
	var key string
	for range 3 {
		res, err := c.Do(context.Background(), idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
		require.NoError(t, err)
		key = res.Key
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{key}, keys, "one send, one Authorize, with the operation's key")
}

// An Authorize that sets the key's header (a wrapper that adds an
// Idempotency-Key of its own, under any spelling) would put a key on the
// wire that is not the operation's, another on each send: one logical
// operation, several keys, the server applying it once per key. It is
// refused as Authorize's failure, nothing sent.
func TestAuthorizeThatSetsTheKeyIsRefused(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"Idempotency-Key", "idempotency-key"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := newScripted(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n == 1 {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), Authorize: func(r *http.Request) error {
				r.Header[name] = []string{"wrapper-key-" + time.Now().Format(time.RFC3339Nano)}
				return nil
			}})
			ctx := context.Background()
			_, err := c.Do(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
			require.ErrorIs(t, err, idem.ErrAuthorizeFailed)
			assert.Contains(t, err.Error(), "Idempotency-Key")
			assert.Empty(t, srv.received(), "nothing sent")
			rec, err := j.Lookup(ctx, "default", "order-1")
			require.NoError(t, err)
			assert.Equal(t, idem.StatePending, rec.State)
		})
	}
}

// An Authorize that fetches its token over HTTP with the request's context
// (oauth2's TokenSource, a vault) makes requests of its own, which are not
// the operation's: they must not count as the transport re-sending it
// (TransportResends, which also marks the operation as maybe applied).
// Each path is compared with the same Authorize that fetches nothing.
func TestAuthorizesOwnRequestsAreNotResends(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"replay", "redirect"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			resends := func(fetch bool) int {
				tokens := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "tok") })
				srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					switch {
					case n == 1 && path == "replay":
						dropConn(w) // unknown: the status check replays it
					case n == 1:
						w.Header().Set("Location", "/orders/v2") // followed within the attempt, Authorize run again
						w.WriteHeader(http.StatusTemporaryRedirect)
					default:
						w.WriteHeader(http.StatusCreated)
					}
				})
				policy := fastRetry()
				policy.MaxAttempts = 1
				c, j := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy, Authorize: func(r *http.Request) error {
					if !fetch {
						r.Header.Set("Authorization", "Bearer tok")
						return nil
					}
					req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, tokens.URL+"/token", nil)
					if err != nil {
						return err
					}
					resp, err := tokens.Client().Do(req)
					if err != nil {
						return err
					}
					defer resp.Body.Close()
					tok, err := io.ReadAll(resp.Body)
					r.Header.Set("Authorization", "Bearer "+string(tok))
					return err
				}})
				ctx := context.Background()
				_, err := c.Do(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
				require.NoError(t, err)
				rec, err := j.Lookup(ctx, "default", "order-1")
				require.NoError(t, err)
				if fetch {
					assert.Len(t, tokens.received(), 2)
				}
				return rec.TransportResends
			}
			assert.Equal(t, resends(false), resends(true), "Authorize's token requests are not re-sends of the operation")
		})
	}
}
