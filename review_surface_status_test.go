package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestStatusAnswerSetCookieInLowerCaseIsNeverJournaled: a status endpoint
// carries the stored response's header as JSON, whose names need not be
// canonical. The journal never holds Set-Cookie (doc.go: "Set-Cookie is
// dropped from stored responses"), whatever case the status answer spells
// it in.
func TestStatusAnswerSetCookieInLowerCaseIsNeverJournaled(t *testing.T) {
	t.Parallel()
	const secret = "sess_5e6f7a8b9c0d1e2f"
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet { // the status endpoint
			w.WriteHeader(http.StatusOK)
			fmt.Fprintf(w, `{"key":%q,"state":"completed","response":{"status":201,"header":{"set-cookie":["session=%s"],"x-secret-token":["%s"]},"body":"{}"}}`,
				r.PathValue("key"), secret, secret)
			return
		}
		dropConn(w) // the attempt's answer is lost: the client asks the status endpoint
	})
	mux := http.NewServeMux()
	mux.Handle("GET /status/{key}", srv.Config.Handler)
	mux.Handle("/", srv.Config.Handler)
	srv.Config.Handler = mux
	c, j := newClient(t, idem.Config{
		BaseURL:       srv.URL,
		Status:        idem.StatusEndpoint(srv.URL + "/status"),
		Retry:         fastRetry(),
		SecretHeaders: []string{"X-Secret-Token"},
	})
	res, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders"})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	for name := range res.Header {
		assert.False(t, strings.EqualFold(name, "Set-Cookie"), "the result carries Set-Cookie: %v", res.Header)
	}
	require.NoError(t, j.Close())
	for _, path := range []string{j.Path(), j.Path() + "-wal"} {
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		require.NoError(t, err)
		assert.False(t, strings.Contains(string(b), secret), "%s holds the status answer's Set-Cookie / secret header, in clear", path)
	}
}
