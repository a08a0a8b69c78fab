package main

import (
	"flag"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func TestParseInterspersed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		pos  []string
		body bool
		as   string
	}{
		{[]string{"k"}, []string{"k"}, false, ""},
		{[]string{"--body", "k"}, []string{"k"}, true, ""},
		{[]string{"k", "--body"}, []string{"k"}, true, ""},
		{[]string{"--as", "x", "k", "--body"}, []string{"k"}, true, "x"},
		{[]string{"k", "--", "--body"}, []string{"k", "--body"}, false, ""},
		{[]string{"--", "-k"}, []string{"-k"}, false, ""},
		{[]string{"a", "b", "--as=y"}, []string{"a", "b"}, false, "y"},
		{nil, nil, false, ""},
	} {
		fs := newFlagSet("t")
		body := fs.Bool("body", false, "")
		as := fs.String("as", "", "")
		pos, err := parseInterspersed(fs, tc.args)
		require.NoError(t, err, tc.args)
		assert.Equal(t, tc.pos, pos, tc.args)
		assert.Equal(t, tc.body, *body, tc.args)
		assert.Equal(t, tc.as, *as, tc.args)
	}
	fs := newFlagSet("t")
	_, err := parseInterspersed(fs, []string{"k", "--nope"})
	assert.ErrorContains(t, err, "flag provided but not defined: -nope")
	_, err = parseInterspersed(newFlagSet("t"), []string{"-h"})
	assert.ErrorIs(t, err, flag.ErrHelp)
}

func TestStateList(t *testing.T) {
	t.Parallel()
	var s stateList
	require.NoError(t, s.Set("pending,in-flight"))
	require.NoError(t, s.Set(" Unknown "))
	assert.Equal(t, stateList{idem.StatePending, idem.StateInFlight, idem.StateUnknown}, s)
	assert.Equal(t, "pending,in_flight,unknown", s.String())
	assert.ErrorContains(t, s.Set("done"), `unknown state "done"`)
	assert.ErrorContains(t, s.Set(","), "empty state name")
}

func TestHeaderEnvList(t *testing.T) {
	t.Parallel()
	var l headerEnvList
	require.NoError(t, l.Set("authorization=API_TOKEN"))
	require.NoError(t, l.Set("X-Tenant=TENANT"))
	assert.Equal(t, headerEnvList{{"Authorization", "API_TOKEN"}, {"X-Tenant", "TENANT"}}, l)
	for _, bad := range []string{"Authorization", "=X", "Authorization=", "Bad Header=X", "Ok=BAD VAR", "AUTHORIZATION=OTHER", "idempotency-key=KEY"} {
		assert.Error(t, l.Set(bad), bad)
	}
	assert.Len(t, l, 2)
}

func TestOutputHelpers(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "-", clean(""))
	assert.Equal(t, "a?b?c", clean("a\tb\x1bc"))

	assert.Equal(t, "operation not found", oneLine("idem: operation not found"))
	assert.Equal(t, "journal /x: unusable path", oneLine("idem journal /x: unusable path"))
	assert.Equal(t, "a b  c", oneLine("a\nb  c\r\n"))
}

func TestOrigin(t *testing.T) {
	t.Parallel()
	o := func(s string) string {
		u, err := url.Parse(s)
		require.NoError(t, err)
		return origin(u)
	}
	assert.Equal(t, "https://api.example.com:443", o("https://API.example.com/v1/orders"))
	assert.Equal(t, o("https://api.example.com"), o("https://api.example.com:443/x"))
	assert.Equal(t, "http://127.0.0.1:8080", o("http://127.0.0.1:8080/idempotency"))
	assert.NotEqual(t, o("http://api.example.com"), o("https://api.example.com"))
	assert.NotEqual(t, o("https://api.example.com"), o("https://api.example.com.evil.test"))
}
