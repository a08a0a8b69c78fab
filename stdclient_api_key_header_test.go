package idem_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// Many APIs take their credential in a header of their own rather than
// Authorization: X-Api-Key (AWS API Gateway, Anthropic), X-Auth-Token, Api-Key. An SDK
// wrapped by the standard client sets it on every request, and nothing
// secret may be journaled. With the default configuration the client
// journals such a header in clear with the operation's request (the
// journal file, the CLI and the web view show it) and sends it again on
// every later attempt, a Resume's after a restart included, the key read
// back from the journal.
func TestStandardClientDoesNotJournalAnAPIKeyHeader(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	for _, name := range []string{"X-Api-Key", "X-Auth-Token", "Api-Key"} {
		t.Run(name, func(t *testing.T) {
			secret := "sk-ant-api03-" + strings.ToLower(strings.ReplaceAll(name, "-", "")) + "-7f6e5d"
			j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
			c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry()})
			ctx, cancel := context.WithTimeout(idem.WithOperation(context.Background(), "op-1"), time.Minute)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/messages", strings.NewReader(`{"n":1}`))
			require.NoError(t, err)
			req.Header.Set(name, secret)
			resp, err := c.StandardClient().Do(req)
			if err != nil {
				// Refused before anything is journaled: a clear error is an answer too.
				assert.ErrorIs(t, err, idem.ErrInvalidOp)
				return
			}
			_ = resp.Body.Close()
			rec, err := j.Lookup(context.Background(), "default", "op-1")
			require.NoError(t, err)
			assert.NotContains(t, rec.Header.Get(name), secret, "the record's request header")
			require.NoError(t, c.Close())
			for _, path := range []string{j.Path(), j.Path() + "-wal"} {
				b, err := os.ReadFile(path)
				if errors.Is(err, os.ErrNotExist) {
					continue
				}
				require.NoError(t, err)
				assert.False(t, bytes.Contains(b, []byte(secret)), "%s holds the %s credential in clear", filepath.Base(path), name)
			}
		})
	}
}
