package idem_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A Location that net/http cannot parse is quoted whole in its error, and
// the reason drops the quoted URL's query by a pattern that ends the query
// at a space or a quote. A header value may hold both (RFC 9110 field
// values allow SP and DQUOTE), so a query "?a=1 sig=…" or "?a=1\"sig=…"
// keeps its token past the cut: in Do's error, the logs, LastError and
// OnTransition's reason.
func TestRedirectLocationTokenAfterASpaceOrQuoteIsNotInTheReason(t *testing.T) {
	t.Parallel()
	const token = "sig_0a9b8c7d6e5f4a3b"
	for name, location := range map[string]string{
		"space": "/orders/%zz?a=1 sig=" + token,
		"quote": `/orders/%zz?a=1"sig=` + token,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", location)
				w.WriteHeader(http.StatusTemporaryRedirect)
			})
			var (
				logs    bytes.Buffer
				mu      sync.Mutex
				reasons []string
			)
			c, _ := newClient(t, idem.Config{
				BaseURL: srv.URL,
				Retry:   fastRetry(),
				Logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
				OnTransition: func(tr idem.Transition) {
					mu.Lock()
					reasons = append(reasons, tr.Reason)
					mu.Unlock()
				},
			})
			_, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders", Body: []byte(`{"n":1}`)})
			require.Error(t, err)
			assert.NotContains(t, err.Error(), token, "the error Do returns")
			assert.NotContains(t, logs.String(), token, "the logs")
			rec, lerr := c.Lookup(context.Background(), "", "a")
			require.NoError(t, lerr)
			assert.NotContains(t, rec.LastError, token, "the journal's LastError")
			mu.Lock()
			defer mu.Unlock()
			assert.NotContains(t, strings.Join(reasons, "\n"), token, "OnTransition's reasons")
		})
	}
}

// The same pattern ends userinfo at a space or a quote: a Location that
// net/http cannot parse, its password holding a space, keeps the part of
// the password before the space in the reason.
func TestRedirectLocationPasswordWithASpaceIsNotInTheReason(t *testing.T) {
	t.Parallel()
	const secret = "pw_7c6b5a49"
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "http://deploy:"+secret+" tail@other.example.test/%zz")
		w.WriteHeader(http.StatusTemporaryRedirect)
	})
	var logs bytes.Buffer
	c, _ := newClient(t, idem.Config{
		BaseURL: srv.URL,
		Retry:   fastRetry(),
		Logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	_, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders", Body: []byte(`{"n":1}`)})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), secret, "the error Do returns")
	assert.NotContains(t, logs.String(), secret, "the logs")
	rec, lerr := c.Lookup(context.Background(), "", "a")
	require.NoError(t, lerr)
	assert.NotContains(t, rec.LastError, secret, "the journal's LastError")
}
