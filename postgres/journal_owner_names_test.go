package postgres_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
)

// TestRegisterRefusesOwnerNamesPostgreSQLCannotKeep: an owner name that a
// text column cannot hold (a NUL, bytes that are not UTF-8) or that is too
// long for the owners' unique index is refused as an invalid record that
// names the owner and says what to change, not with the server's error,
// and nothing is recorded; idem.New says the same.
func TestRegisterRefusesOwnerNamesPostgreSQLCannotKeep(t *testing.T) {
	t.Parallel()
	j := openJournal(t)
	srv := testserver.Start(t)
	for what, name := range map[string]string{
		"a NUL":           "worker\x00one",
		"not UTF-8":       "caf\xe9",
		"over 1024 bytes": strings.Repeat("w", 1025),
	} {
		_, err := j.Register(ctx, name)
		require.Error(t, err, what)
		assert.ErrorIs(t, err, idem.ErrInvalidRecord, what)
		assert.Contains(t, err.Error(), "owner name", what)
		_, err = idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.StatusURL), Owner: name})
		assert.ErrorIs(t, err, idem.ErrInvalidRecord, what)
	}
	assert.Empty(t, owners(t, j.Schema()), "a refused name is recorded nowhere")
}
