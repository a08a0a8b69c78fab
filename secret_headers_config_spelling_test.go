package idem_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// Config.SecretHeaders names headers never journaled, in any spelling of
// the name. An entry read from a configuration file with a space around
// it (" x-session-token", "X-Session-Token ") is no HTTP token: New takes
// it without a word, it matches no header, and the header it was meant to
// protect is journaled in clear. New refuses every other field without
// meaning (ErrInvalidConfig); this one must be refused or matched.
func TestASecretHeaderNamedWithSpacesIsRefusedOrKeptSecret(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	for _, name := range []string{" x-session-token", "X-Session-Token ", "x-session-token\n"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const secret = "st_live_3f2e1d0c9b8a"
			j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
			c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry(), SecretHeaders: []string{name}})
			if err != nil {
				assert.ErrorIs(t, err, idem.ErrInvalidConfig)
				return
			}
			_, err = c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders", Header: http.Header{"X-Session-Token": {secret}}})
			if err != nil {
				// Refused as a credential before anything is journaled.
				require.ErrorIs(t, err, idem.ErrInvalidOp)
			}
			require.NoError(t, c.Close())
			for _, path := range []string{j.Path(), j.Path() + "-wal"} {
				b, err := os.ReadFile(path)
				if errors.Is(err, os.ErrNotExist) {
					continue
				}
				require.NoError(t, err)
				assert.False(t, bytes.Contains(b, []byte(secret)), "%s holds X-Session-Token in clear (SecretHeaders %q)", filepath.Base(path), name)
			}
		})
	}
}
