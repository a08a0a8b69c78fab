package main

import (
	"testing"
)

// A connection string the command does not take for a PostgreSQL URL —
// one whose scheme is written in capitals, one of another scheme, or
// libpq's keyword form — is taken for a file's path; the message that
// names that path must not show the password in it.
func TestPasswordOfAnUnrecognizedDSNIsNotEchoed(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"POSTGRES://postgres:" + testPassword + "@127.0.0.1:5432/test",
		"Postgresql://postgres:" + testPassword + "@127.0.0.1:5432/test",
		"pgsql://postgres:" + testPassword + "@127.0.0.1:5432/test",
		"host=127.0.0.1 user=postgres password=" + testPassword + " dbname=test",
		"host=127.0.0.1 user=postgres password='" + testPassword + "' dbname=test",
	} {
		for _, args := range [][]string{{"--journal", dsn, "ls"}, {"--journal", dsn, "migrate"}} {
			r := cli(t, "", nil, args...)
			requireOneLineError(t, r, exitError, "")
			requireNoPassword(t, r, args[2:])
		}
		r := cli(t, "", []string{"IDEM_JOURNAL=" + dsn}, "stats")
		requireOneLineError(t, r, exitError, "")
		requireNoPassword(t, r, []string{"stats"})
	}
}
