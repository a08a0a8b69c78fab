package main

import (
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
)

// sslpassword, the passphrase of the client's TLS key that pgx reads from
// the URL, is as secret as the password: no message or output shows it.
func TestSSLPasswordIsNotShown(t *testing.T) {
	t.Parallel()
	schema, j := pgJournal(t)
	put(t, j, op{id: "checkout/cart-1"})
	u, err := url.Parse(testDSN())
	require.NoError(t, err)
	q := u.Query()
	q.Set("sslpassword", testPassword)
	u.RawQuery = q.Encode()
	dsn := u.String()

	r := cli(t, "", nil, "--journal", dsn, "--schema", schema, "stats")
	requireOK(t, r)
	requireNoPassword(t, r, []string{"stats"})

	r = cli(t, "", nil, "--journal", dsn, "--schema", schema+"_none", "ls")
	requireOneLineError(t, r, exitError, "no idem journal")
	requireNoPassword(t, r, []string{"ls"})
}
