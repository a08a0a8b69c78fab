package server_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

// A handler that writes a response header whose value is not UTF-8
// (obs-text, which HTTP allows and net/http sends as is: a
// Content-Disposition with a Latin-1 file name). The package doc: a retry
// with the key gets "the stored response, status, headers and body byte
// for byte"; a client that got the first answer and retries gets the same
// one. The memory store keeps that promise; the SQLite store (and the
// PostgreSQL one, postgres/headers_bytes_test.go) keep the header as JSON,
// which turns each byte that is not UTF-8 into U+FFFD: the retry's
// header differs from the first answer's. server/storetest has no such
// input, so no store is held to it.
func TestRetryGetsTheFirstAnswersHeadersByteForByte(t *testing.T) {
	t.Parallel()
	const value = "attachment; filename=\"caf\xe9.txt\""
	for name, store := range map[string]func(t *testing.T) server.Store{
		"memory": func(*testing.T) server.Store { return server.NewMemoryStore() },
		"sqlite": func(t *testing.T) server.Store { return openSQLite(t) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			mw, err := server.New(server.Config{Store: store(t), Scope: server.SingleTenant})
			require.NoError(t, err)
			defer mw.Close()
			srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Disposition", value)
				w.WriteHeader(http.StatusCreated)
			})))
			defer srv.Close()
			send := func() *http.Response {
				req, err := http.NewRequest(http.MethodPost, srv.URL+"/files", strings.NewReader("{}"))
				require.NoError(t, err)
				req.Header.Set("Idempotency-Key", `"k-1"`)
				res, err := srv.Client().Do(req)
				require.NoError(t, err)
				_, _ = io.Copy(io.Discard, res.Body)
				_ = res.Body.Close()
				return res
			}
			first := send()
			require.Equal(t, http.StatusCreated, first.StatusCode)
			require.Equal(t, []byte(value), []byte(first.Header.Get("Content-Disposition")), "the first answer carries the handler's bytes")
			retry := send()
			require.Equal(t, http.StatusCreated, retry.StatusCode)
			assert.Equal(t, []byte(value), []byte(retry.Header.Get("Content-Disposition")), "the retry's header is the first answer's, byte for byte")
		})
	}
}
