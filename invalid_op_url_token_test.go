package idem_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A URL's query and userinfo may carry a token, and every error and log of
// the client quotes URLs without them (Call.URL, Classify's reasons, a
// transport's *url.Error). Do's refusal of an Op whose URL it cannot use
// is an error the application logs too: it must not quote the token.
func TestAnInvalidOpURLsTokenIsNotInTheError(t *testing.T) {
	t.Parallel()
	const token = "qk_live_5e4d3c2b1a098877"
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	cases := []struct {
		name, base, url string
	}{
		{"relative without BaseURL", "", "/orders?api_key=" + token},
		{"scheme not http", "", "ftp://api.example.test/orders?api_key=" + token},
		{"no host", "", "http:///orders?api_key=" + token},
		{"does not parse", "", "http://api.example.test/orders/%zz?api_key=" + token},
		{"does not parse, with BaseURL", srv.URL, "/orders/%zz?api_key=" + token},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			c, _ := newClient(t, idem.Config{BaseURL: tc.base, Retry: fastRetry(),
				Journal: openJournal(t, filepath.Join(t.TempDir(), "ops.db")),
				Logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			_, err := c.Do(context.Background(), idem.Op{ID: "a", URL: tc.url})
			require.Error(t, err)
			assert.NotContains(t, err.Error(), token, "Do's error quotes the URL's query token")
			assert.NotContains(t, logs.String(), token, "a log line quotes the URL's query token")
		})
	}
}
