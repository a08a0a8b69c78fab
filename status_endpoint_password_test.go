package idem_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A status endpoint's base URL that carries userinfo puts a password in
// the checker's name, and the name is in every failed check's reason:
// the journal's LastError and history, the warning logged, and the error
// Do returns. Credentials belong in Config.Authorize (New refuses them in
// Config.BaseURL and Op.URL): either New refuses this base too, or nothing
// of the password is journaled, logged or returned.
func TestAStatusEndpointPasswordIsNeverJournaledOrLogged(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-status-pw"
	srv, _ := droppingServer(t)
	base := strings.Replace(srv.URL, "http://", "http://statususer:"+secret+"@", 1) + "/idempotency"
	var logs lockedBuffer
	j := openJournal(t, t.TempDir()+"/ops.db")
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(base), Retry: fastRetry(),
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		assert.ErrorIs(t, err, idem.ErrInvalidConfig)
		assert.NotContains(t, err.Error(), secret)
		return
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	_, err = c.Do(ctx, orderOp("op-1", 1))
	require.Error(t, err)
	assert.True(t, errors.Is(err, idem.ErrOutcomeUnknown), "%v", err)
	assert.NotContains(t, err.Error(), secret, "Do's error")
	assert.NotContains(t, logs.String(), secret, "the logs")
	rec, err := c.Lookup(ctx, "default", "op-1")
	require.NoError(t, err)
	assert.NotContains(t, rec.LastError, secret, "the record's LastError")
	h, err := j.History(ctx, rec.Key)
	require.NoError(t, err)
	for _, e := range h {
		assert.NotContains(t, e.Detail, secret, "a history event")
	}
	require.NoError(t, c.Close())
	for _, path := range []string{j.Path(), j.Path() + "-wal"} {
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		require.NoError(t, err)
		assert.False(t, bytes.Contains(b, []byte(secret)), "%s holds the status endpoint's password in clear", path)
	}
}
