package server_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/server"
)

func TestMethodsNotDeclaredIdempotentPassThrough(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		_, ok := server.KeyFromContext(r.Context())
		assert.False(t, ok, "a pass-through request carries no key")
		w.WriteHeader(http.StatusAccepted)
	})
	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		r := e.do(method, "/orders", "")
		assert.Equal(t, http.StatusAccepted, r.Status, method)
	}
	// Twice with the same key: a non-idempotent method is never replayed.
	e.do(http.MethodPut, "/orders", "", "Idempotency-Key", "k")
	r := e.do(http.MethodPut, "/orders", "", "Idempotency-Key", "k")
	assert.False(t, r.replayed())
	assert.EqualValues(t, 5, e.calls.Load())
}

func TestConfiguredMethodsAndHeader(t *testing.T) {
	t.Parallel()
	e := newEnv(t, created, func(c *server.Config) {
		c.Methods = []string{"put"}
		c.Header = "X-Request-Key"
	})
	assert.Equal(t, http.StatusCreated, e.do(http.MethodPost, "/orders", "{}").Status, "POST is no longer declared")
	r := e.do(http.MethodPut, "/orders", "{}", "Idempotency-Key", "k")
	assert.Equal(t, wire.ProblemKeyMissing, r.problem(t).Type, "the key is read from the configured header only")
	e.do(http.MethodPut, "/orders", "{}", "X-Request-Key", "k")
	r = e.do(http.MethodPut, "/orders", "{}", "X-Request-Key", "k")
	assert.True(t, r.replayed())
	assert.EqualValues(t, 2, e.calls.Load())
}

func TestMissingKeyIs400(t *testing.T) {
	t.Parallel()
	e := newEnv(t, created)
	for _, value := range []string{"", `""`} {
		var r reply
		if value == "" {
			r = e.do(http.MethodPost, "/orders", "{}")
		} else {
			r = e.post("/orders", value, "{}")
		}
		require.Equal(t, http.StatusBadRequest, r.Status)
		p := r.problem(t)
		assert.Equal(t, wire.ProblemKeyMissing, p.Type)
		assert.Contains(t, p.Detail, "Idempotency-Key")
	}
	assert.Zero(t, e.calls.Load(), "nothing runs without a key")
}

func TestInvalidKeysAre400(t *testing.T) {
	t.Parallel()
	e := newEnv(t, created)
	long := strings.Repeat("k", 256)
	for name, header := range map[string][]string{
		"longer than 255":        {"Idempotency-Key", long},
		"quoted longer than 255": {"Idempotency-Key", `"` + long + `"`},
		"not a token":            {"Idempotency-Key", "a b"},
		"unterminated string":    {"Idempotency-Key", `"abc`},
		"bad escape":             {"Idempotency-Key", `"a\b"`},
		"two header lines":       {"Idempotency-Key", "a", "Idempotency-Key", "b"},
	} {
		r := e.do(http.MethodPost, "/orders", "{}", header...)
		assert.Equal(t, http.StatusBadRequest, r.Status, name)
		assert.Equal(t, wire.ProblemKeyInvalid, r.problem(t).Type, name)
	}
	assert.Zero(t, e.calls.Load())

	// The limit counts the unquoted key: 255 bytes are fine in both forms.
	ok := strings.Repeat("k", 255)
	assert.Equal(t, http.StatusCreated, e.post("/orders", ok, "{}").Status)
	assert.True(t, e.post("/orders", `"`+ok+`"`, "{}").replayed())
}

func TestMaxKeyLengthIsConfigurable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, created, func(c *server.Config) { c.MaxKeyLength = 4 })
	assert.Equal(t, http.StatusCreated, e.post("/orders", "abcd", "{}").Status)
	assert.Equal(t, http.StatusBadRequest, e.post("/orders", "abcde", "{}").Status)
}

func TestBareAndQuotedKeyAreTheSameKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		k, ok := server.KeyFromContext(r.Context())
		require.True(t, ok)
		_, _ = w.Write([]byte(k))
	})
	first := e.post("/orders", "abc", "{}")
	assert.Equal(t, "abc", first.Body, "the handler sees the unquoted key")
	second := e.post("/orders", `"abc"`, "{}")
	assert.True(t, second.replayed())
	assert.Equal(t, "abc", second.Body)
	assert.EqualValues(t, 1, e.calls.Load())

	// Quoting lets a key hold characters a token cannot.
	third := e.post("/orders", `"a key \"with\" quotes"`, "{}")
	assert.Equal(t, `a key "with" quotes`, third.Body)
}

func TestReplayIsTheStoredResponseByteForByte(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/octet-stream")
		h.Add("X-Multi", "one")
		h.Add("X-Multi", "two")
		http.SetCookie(w, &http.Cookie{Name: "session", Value: "secret"})
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("part one, "))
		_, _ = w.Write([]byte("binary \x00\xff"))
		h.Set("X-After-WriteHeader", "ignored")
	})
	first := e.post("/orders", "k1", `{"item":"book"}`)
	second := e.post("/orders", "k1", `{"item":"book"}`)
	assert.EqualValues(t, 1, e.calls.Load(), "the handler runs once")

	assert.Equal(t, http.StatusCreated, first.Status)
	assert.Equal(t, "part one, binary \x00\xff", first.Body)
	assert.False(t, first.replayed())
	assert.NotEmpty(t, first.Header.Values("Set-Cookie"), "the first caller gets its cookie")
	assert.Empty(t, first.Header.Get("X-After-WriteHeader"))

	assert.True(t, second.replayed())
	assert.Equal(t, first.Status, second.Status)
	assert.Equal(t, first.Body, second.Body)
	assert.Empty(t, second.Header.Values("Set-Cookie"), "Set-Cookie is never stored")
	for _, h := range []string{"Content-Type", "X-Multi", "Content-Length"} {
		assert.Equal(t, first.Header.Values(h), second.Header.Values(h), h)
	}
	assert.Equal(t, []string{"one", "two"}, second.Header.Values("X-Multi"))
}

func TestSniffedContentTypeIsStored(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("<html><body>hi</body></html>"))
	})
	first := e.post("/orders", "k", "{}")
	second := e.post("/orders", "k", "{}")
	assert.Equal(t, "text/html; charset=utf-8", first.Header.Get("Content-Type"))
	assert.Equal(t, first.Header.Get("Content-Type"), second.Header.Get("Content-Type"))
	s, _, _ := e.status("k")
	assert.Equal(t, "text/html; charset=utf-8", s.Response.Header.Get("Content-Type"), "the status endpoint shows the same type")
}

// storeCheckingWriter fails the test if the response starts before the
// store holds it.
type storeCheckingWriter struct {
	http.ResponseWriter
	t       *testing.T
	check   func() server.Entry
	checked atomic.Bool
}

func (w *storeCheckingWriter) WriteHeader(code int) {
	e := w.check()
	assert.Equal(w.t, server.Completed, e.State, "the response must be stored before it is sent")
	if assert.NotNil(w.t, e.Response) {
		assert.Equal(w.t, code, e.Response.Status)
	}
	w.checked.Store(true)
	w.ResponseWriter.WriteHeader(code)
}

func TestResponseIsStoredBeforeItIsSent(t *testing.T) {
	t.Parallel()
	store := server.NewMemoryStore()
	mw, err := server.New(server.Config{Store: store, Scope: server.SingleTenant})
	require.NoError(t, err)
	defer mw.Close()
	var sw *storeCheckingWriter
	inner := mw.Handler(http.HandlerFunc(created))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw = &storeCheckingWriter{ResponseWriter: w, t: t, check: func() server.Entry {
			e, err := store.Get(context.Background(), "", "k", timeNow())
			require.NoError(t, err)
			return e
		}}
		inner.ServeHTTP(sw, r)
	}))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.True(t, sw.checked.Load())
}

func TestDuplicateWhileRunningIs409(t *testing.T) {
	t.Parallel()
	g := newGate()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		g.wait()
		created(w, r)
	}, func(c *server.Config) { c.RetryAfter = 1500 * time.Millisecond })
	done := make(chan reply, 1)
	go func() {
		r, err := e.send(context.Background(), http.MethodPost, "/orders", `{"n":1}`, "Idempotency-Key", "k")
		assert.NoError(t, err)
		done <- r
	}()
	g.waitEntered(t)
	dup := e.post("/orders", "k", `{"n":1}`)
	require.Equal(t, http.StatusConflict, dup.Status)
	assert.Equal(t, wire.ProblemInProgress, dup.problem(t).Type)
	assert.Equal(t, "k", dup.problem(t).Key)
	assert.Equal(t, "2", dup.Header.Get("Retry-After"), "Retry-After is RetryAfter rounded up to seconds")
	g.release()
	first := <-done
	assert.Equal(t, http.StatusCreated, first.Status)
	after := e.post("/orders", "k", `{"n":1}`)
	assert.True(t, after.replayed())
	assert.Equal(t, first.Body, after.Body)
	assert.EqualValues(t, 1, e.calls.Load())
}

func TestSameKeyOtherPayloadIs422(t *testing.T) {
	t.Parallel()
	g := newGate()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			g.wait()
		}
		created(w, r)
	})
	e.post("/orders", "k", `{"n":1}`)
	for name, r := range map[string]reply{
		"other body":  e.post("/orders", "k", `{"n":2}`),
		"other query": e.post("/orders?x=1", "k", `{"n":1}`),
	} {
		require.Equal(t, http.StatusUnprocessableEntity, r.Status, name)
		p := r.problem(t)
		assert.Equal(t, wire.ProblemKeyReused, p.Type, name)
		assert.Contains(t, p.Detail, "different request body or query", name)
	}
	// A mismatch is reported while the first request still runs, too.
	go e.send(context.Background(), http.MethodPost, "/orders?hold=1", `{}`, "Idempotency-Key", "held") //nolint:errcheck
	g.waitEntered(t)
	r := e.post("/orders?hold=1", "held", `{"other":true}`)
	assert.Equal(t, http.StatusUnprocessableEntity, r.Status)
	g.release()
	require.Eventually(t, func() bool { return e.post("/orders?hold=1", "held", `{}`).replayed() }, timeout, tick)
	assert.EqualValues(t, 2, e.calls.Load())
}

func TestSameKeyOnAnotherRouteIs422NamingTheFirstRoute(t *testing.T) {
	t.Parallel()
	e := newEnv(t, created)
	require.Equal(t, http.StatusCreated, e.post("/charges", "k", `{"amount":5}`).Status)
	for _, r := range []reply{
		e.post("/refunds", "k", `{"amount":5}`),
		e.do(http.MethodPatch, "/charges", `{"amount":5}`, "Idempotency-Key", "k"),
	} {
		require.Equal(t, http.StatusUnprocessableEntity, r.Status)
		p := r.problem(t)
		assert.Equal(t, wire.ProblemKeyReused, p.Type)
		assert.Contains(t, p.Detail, "POST /charges", "the detail names the route the key was first used on")
		assert.NotContains(t, r.Body, "amount", "a /charges result is never replayed for another route")
	}
	assert.EqualValues(t, 1, e.calls.Load())
}

func TestTenantsAreIsolated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("for " + r.Header.Get("X-Tenant")))
	}, withTenantScope())
	a := e.post("/orders", "k", "{}", "X-Tenant", "a")
	b := e.post("/orders", "k", `{"other":"payload"}`, "X-Tenant", "b")
	assert.Equal(t, "for a", a.Body)
	assert.Equal(t, "for b", b.Body, "another tenant's key is its own, whatever its payload")
	assert.False(t, b.replayed())
	assert.Equal(t, "for a", e.post("/orders", "k", "{}", "X-Tenant", "a").Body)
	assert.Equal(t, "for b", e.post("/orders", "k", `{"other":"payload"}`, "X-Tenant", "b").Body)
	assert.EqualValues(t, 2, e.calls.Load())

	s, body, _ := e.status("k", "X-Tenant", "b")
	assert.Equal(t, wire.StateCompleted, s.State)
	assert.Equal(t, "for b", string(body))
	s, _, _ = e.status("k", "X-Tenant", "c")
	assert.Equal(t, wire.StateNotFound, s.State, "a third tenant sees nothing")
}

func TestHandlerGetsBodyAndKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		k, _ := server.KeyFromContext(r.Context())
		assert.Equal(t, "the-key", k)
		created(w, r)
	})
	r := e.post("/orders", "the-key", `{"item":"pen"}`)
	assert.Equal(t, `{"echo":{"item":"pen"}}`, r.Body, "the handler reads the body the middleware fingerprinted")
}

func TestBodyOverLimitIs413(t *testing.T) {
	t.Parallel()
	e := newEnv(t, created, func(c *server.Config) { c.MaxBodyBytes = 10 })
	r := e.post("/orders", "k", `{"item":"too long"}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, r.Status)
	assert.Equal(t, wire.ProblemBodyTooLarge, r.problem(t).Type)
	assert.Zero(t, e.calls.Load())
	assert.Equal(t, http.StatusCreated, e.post("/orders", "k", `{"n":1}`).Status, "a body at the limit is fine, and the key was not taken")
}

func TestServerErrorsAreStoredByDefault(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	})
	first := e.post("/orders", "k", "{}")
	second := e.post("/orders", "k", "{}")
	assert.Equal(t, http.StatusInternalServerError, first.Status)
	assert.Equal(t, http.StatusInternalServerError, second.Status)
	assert.True(t, second.replayed(), "a stored 5xx is replayed, as Stripe does")
	assert.EqualValues(t, 1, e.calls.Load())
}

func TestSkipServerErrorsRunsTheRetry(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			http.Error(w, "boom", http.StatusServiceUnavailable)
			return
		}
		created(w, r)
	}, func(c *server.Config) { c.StorePolicy = server.SkipServerErrors })
	first := e.post("/orders", "k", "{}")
	assert.Equal(t, http.StatusServiceUnavailable, first.Status)
	s, _, _ := e.status("k")
	assert.Equal(t, wire.StateNotFound, s.State, "an unstored 5xx leaves no entry")
	second := e.post("/orders", "k", "{}")
	assert.Equal(t, http.StatusCreated, second.Status)
	assert.False(t, second.replayed())
	third := e.post("/orders", "k", "{}")
	assert.True(t, third.replayed(), "a 2xx is still stored")
	assert.EqualValues(t, 2, e.calls.Load())
}

func TestHandlerCannotFlush(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("partial"))
		rc := http.NewResponseController(w)
		assert.ErrorIs(t, rc.Flush(), http.ErrNotSupported, "a flush would send bytes that are not stored yet")
		_, _, err := rc.Hijack()
		assert.ErrorIs(t, err, http.ErrNotSupported)
		_, _ = w.Write([]byte(" and the rest"))
	})
	assert.Equal(t, "partial and the rest", e.post("/orders", "k", "{}").Body)
}

func TestHandlerContextOutlivesTheClient(t *testing.T) {
	t.Parallel()
	g := newGate()
	handlerErr := make(chan error, 1)
	// The connection's own context, watched from in front of the middleware.
	var outer atomic.Pointer[context.Context]
	watch := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				ctx := r.Context()
				outer.Store(&ctx)
			}
			next.ServeHTTP(w, r)
		})
	}
	e := newWrappedEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			g.wait()
			handlerErr <- r.Context().Err()
		}
		created(w, r)
	}, watch)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := e.send(ctx, http.MethodPost, "/orders", `{"n":1}`, "Idempotency-Key", "k", "X-Hold", "1")
		errc <- err
	}()
	g.waitEntered(t)
	cancel() // the client gives up while the handler runs
	require.ErrorIs(t, <-errc, context.Canceled)
	require.Eventually(t, func() bool { return (*outer.Load()).Err() != nil }, timeout, tick, "the server notices the client left")
	g.release()
	require.NoError(t, <-handlerErr, "the handler's context is not canceled by the client leaving")
	require.Eventually(t, func() bool {
		s, _, _ := e.status("k")
		return s.State == wire.StateCompleted
	}, timeout, tick)
	r := e.post("/orders", "k", `{"n":1}`)
	assert.True(t, r.replayed(), "the client's retry gets the result of the work it started")
	assert.EqualValues(t, 1, e.calls.Load())
}

func TestStoreFailureBeforeTheHandlerIs503(t *testing.T) {
	t.Parallel()
	store := openSQLite(t)
	e := newEnv(t, created, withStore(store))
	require.NoError(t, store.Close())
	r := e.post("/orders", "k", "{}")
	require.Equal(t, http.StatusServiceUnavailable, r.Status)
	assert.Equal(t, wire.ProblemStoreFailed, r.problem(t).Type)
	assert.Equal(t, "1", r.Header.Get("Retry-After"))
	assert.Zero(t, e.calls.Load(), "the handler never runs when the claim could not be recorded")
}

func TestStoreClosedAfterTheHandlerIs409InProgress(t *testing.T) {
	t.Parallel()
	store := openSQLite(t)
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		// The store goes away while the handler runs.
		require.NoError(t, store.Close())
		created(w, r)
	}, withStore(store))
	r := e.post("/orders", "k", "{}")
	require.Equal(t, http.StatusConflict, r.Status, "a response that is not stored is not sent")
	assert.Equal(t, wire.ProblemInProgress, r.problem(t).Type, "and the client is not told to send the request again")
	assert.NotContains(t, r.Body, "echo")
}

func TestCloseIsIdempotent(t *testing.T) {
	t.Parallel()
	mw, err := server.New(server.Config{Store: server.NewMemoryStore(), Scope: server.SingleTenant})
	require.NoError(t, err)
	require.NoError(t, mw.Close())
	require.NoError(t, mw.Close())
}

func TestKeyFromContextWithoutKey(t *testing.T) {
	t.Parallel()
	_, ok := server.KeyFromContext(context.Background())
	assert.False(t, ok)
}
