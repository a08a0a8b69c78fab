package idem_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// review11IsTChar is RFC 9110's tchar, written out apart from the
// client's table.
func review11IsTChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// review11Refused asserts that op was refused with ErrInvalidOp and a
// message holding want, with nothing sent or journaled.
func review11Refused(t *testing.T, c *idem.Client, j idem.Journal, sent *atomic.Int32, op idem.Op, want, what string) {
	t.Helper()
	before := sent.Load()
	_, err := c.Do(context.Background(), op)
	if !assert.ErrorIs(t, err, idem.ErrInvalidOp, what) {
		return
	}
	assert.Contains(t, err.Error(), want, what)
	assert.Equal(t, before, sent.Load(), "%s: sent", what)
	scope := op.Scope
	if scope == "" {
		scope = "default"
	}
	if op.ID != "" && utf8.ValidString(op.ID) {
		_, lerr := j.Lookup(context.Background(), scope, op.ID)
		assert.ErrorIs(t, lerr, idem.ErrNotFound, "%s: journaled", what)
	}
}

// Risk pinned (passes; kept): the bit set of tchars that now guards an
// Op's header names and method, every byte tried through Client.Do. A byte
// outside the set is refused before anything is journaled or sent, with
// an error that says what is wrong; one inside goes out, as sent.
func TestReview11EveryByteOfAnOpsHeaderNameAndMethodIsAllowedExactlyWhenItIsATChar(t *testing.T) {
	t.Parallel()
	var sent atomic.Int32
	var lastMethod atomic.Value
	srv := newReview11Server(t, func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		lastMethod.Store(r.Method)
		w.WriteHeader(http.StatusCreated)
	})
	j := idem.NewMemoryJournal()
	c, err := idem.New(idem.Config{BaseURL: srv, Journal: j, Scope: "default"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	for b := 0; b < 256; b++ {
		name := "X-" + string([]byte{byte(b)}) + "z"
		op := idem.Op{ID: fmt.Sprintf("h-%d", b), URL: "/orders", Header: http.Header{name: {"v"}}}
		what := fmt.Sprintf("header name %q", name)
		if review11IsTChar(byte(b)) {
			before := sent.Load()
			res, err := c.Do(context.Background(), op)
			if assert.NoError(t, err, what) {
				assert.Equal(t, http.StatusCreated, res.StatusCode, what)
				assert.Equal(t, before+1, sent.Load(), what)
			}
			continue
		}
		review11Refused(t, c, j, &sent, op, "not an HTTP token", what)
	}
	for b := 0; b < 256; b++ {
		method := "P" + string([]byte{byte(b)}) + "T"
		op := idem.Op{ID: fmt.Sprintf("m-%d", b), URL: "/orders", Method: method}
		what := fmt.Sprintf("method %q", method)
		if review11IsTChar(byte(b)) {
			_, err := c.Do(context.Background(), op)
			if assert.NoError(t, err, what) {
				assert.Equal(t, method, lastMethod.Load(), what)
			}
			continue
		}
		review11Refused(t, c, j, &sent, op, "not an HTTP method", what)
	}
}

// newReview11Server serves h on 127.0.0.1 and returns its base URL.
func newReview11Server(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// review11OldRefusesName is the check of an Op's ID and scope before
// today's change (fbad330), by runes.
func review11OldRefusesName(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "UTF-8"
	case strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return "control characters"
	}
	return ""
}

// review11OldRefusesValue is the check of a header value before today's
// change, by runes.
func review11OldRefusesValue(v string) bool {
	return strings.ContainsFunc(v, func(r rune) bool { return (r < 0x20 && r != '\t') || r == 0x7f })
}

// review11Odd are strings beside ASCII the byte-wise checks must judge as
// the rune-wise ones did.
func review11Odd() []string {
	odd := []string{
		"\xc2\x80", "\xc2\x85", "\xc2\x9f", "\xc2\xa0", // C1 controls, NBSP
		"\xed\xa0\x80", "\xed\xbf\xbf", // lone surrogates
		"\xc0\x80", "\xc0\x8a", "\xc1\xbf", "\xe0\x80\x80", "\xf0\x80\x80\x80", // overlong NUL, LF, DEL...
		"\xf4\x90\x80\x80", "\xf8\x88\x80\x80\x80", // beyond U+10FFFF
		"\xe2\x80\xa8", "\xef\xbb\xbf", "\xef\xbf\xbd", // LS, BOM, U+FFFD
		"\xc3", "é\x00", "é\x7f", "é\t", "é\n", "\xff\n", "\n\xff",
	}
	for b := 0; b < 256; b++ {
		odd = append(odd, string([]byte{byte(b)}))
	}
	return odd
}

// Risk pinned (passes; kept): an Op's ID, scope and header values hold,
// byte by byte, what the rune-wise checks before today's change refused
// and let through: every byte, C1 controls, lone surrogates, overlong
// encodings, invalid UTF-8 beside controls. A refused one is refused
// before anything is journaled or sent, for the reason the old check gave.
func TestReview11OpNamesAndHeaderValuesAreJudgedAsTheRuneWiseChecksJudgedThem(t *testing.T) {
	t.Parallel()
	var sent atomic.Int32
	srv := newReview11Server(t, func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		w.WriteHeader(http.StatusCreated)
	})
	j := idem.NewMemoryJournal()
	c, err := idem.New(idem.Config{BaseURL: srv, Journal: j, Scope: "default"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	for i, s := range review11Odd() {
		for _, form := range []string{"a" + s + "b", s} {
			id := "id-" + form
			what := fmt.Sprintf("ID %q", id)
			if why := review11OldRefusesName(id); why != "" {
				review11Refused(t, c, j, &sent, idem.Op{ID: id, URL: "/orders"}, why, what)
			} else {
				_, err := c.Do(context.Background(), idem.Op{ID: id, URL: "/orders"})
				assert.NoError(t, err, what)
			}
			scope := "t" + form
			what = fmt.Sprintf("scope %q", scope)
			op := idem.Op{Scope: scope, ID: fmt.Sprintf("s-%d", i), URL: "/orders"}
			if why := review11OldRefusesName(scope); why != "" {
				review11Refused(t, c, j, &sent, op, why, what)
			} else {
				_, err := c.Do(context.Background(), op)
				assert.NoError(t, err, what)
			}
			what = fmt.Sprintf("header value %q", form)
			op = idem.Op{ID: fmt.Sprintf("v-%d-%d", i, len(form)), URL: "/orders", Header: http.Header{"X-Note": {"ok", form}}}
			if review11OldRefusesValue(form) {
				review11Refused(t, c, j, &sent, op, "control character", what)
			} else {
				before := sent.Load()
				_, err := c.Do(context.Background(), op)
				if assert.NoError(t, err, what) {
					assert.Equal(t, before+1, sent.Load(), what)
				}
			}
		}
	}
	// At the limit (512 bytes) in runes of two bytes, and one byte over.
	_, err = c.Do(context.Background(), idem.Op{ID: strings.Repeat("é", 256), URL: "/orders"})
	assert.NoError(t, err, "an ID of 512 bytes in runes of two")
	review11Refused(t, c, j, &sent, idem.Op{ID: strings.Repeat("a", 511) + "é", URL: "/orders"}, "limit is 512", "an ID of 513 bytes ending in a rune of two")
	review11Refused(t, c, j, &sent, idem.Op{ID: strings.Repeat("a", 511) + "\xc3", URL: "/orders"}, "UTF-8", "an ID of 512 bytes ending in half a rune")
	review11Refused(t, c, j, &sent, idem.Op{ID: strings.Repeat("a", 511) + "\x7f", URL: "/orders"}, "control characters", "an ID of 512 bytes ending in DEL")
}

// review11RawServer answers every request on 127.0.0.1 with head (status
// line and header lines, CRLF-separated, without the blank line) and an
// empty body, and counts requests.
func review11RawServer(t *testing.T, head string, n *atomic.Int32) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				r := bufio.NewReader(conn)
				for {
					req, err := http.ReadRequest(r)
					if err != nil {
						return
					}
					_ = req.Body.Close()
					n.Add(1)
					if _, err := conn.Write([]byte(head + "\r\nContent-Length: 0\r\n\r\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// Risk pinned (passes; kept): an answer's secret headers, in whatever
// spelling a raw server sends them, are neither returned nor journaled;
// names of odd but legal punctuation are kept.
func TestReview11SecretHeadersOfAnAnswerInOddSpellingsAreNeitherReturnedNorJournaled(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	head := "HTTP/1.1 201 Created\r\nset-cookie: a=1\r\nSET-COOKIE: b=2\r\nsEt-CoOkIe: c=3\r\nx-api-key: k1\r\nX-API-KEY: k2\r\n" +
		"api-key: k3\r\nx-auth-token: k4\r\nproxy-authorization: k5\r\nauthorization: k6\r\nX-Secret-Name: k7\r\n" +
		"X-Odd!#$%&'*+-.^_`|~: kept"
	srv := review11RawServer(t, head, &n)
	j := idem.NewMemoryJournal()
	c, err := idem.New(idem.Config{BaseURL: srv, Journal: j, Scope: "default", SecretHeaders: []string{"x-secret-name"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	res, err := c.Do(context.Background(), idem.Op{ID: "odd-answer", URL: "/orders"})
	require.NoError(t, err)
	rec, err := j.Lookup(context.Background(), "default", "odd-answer")
	require.NoError(t, err)
	require.NotNil(t, rec.Response)
	for _, h := range []http.Header{res.Header, rec.Response.Header} {
		for name, vs := range h {
			for _, v := range vs {
				assert.NotRegexp(t, `^(k[1-7]|[abc]=\d)$`, v, "secret %s: %s kept", name, v)
			}
		}
		assert.Equal(t, []string{"kept"}, h["X-Odd!#$%&'*+-.^_`|~"])
	}
	assert.Equal(t, int32(1), n.Load())
}

// Risk checked (passes; kept): an answer whose header name holds a byte
// of 0x80 or more, or a space, is not taken apart into a journaled header:
// either the transport refuses it as a malformed answer (the outcome
// stays unknown, nothing journaled of it) or the name is dropped. Its
// value, which may be a secret under a spelling no rule matches, never
// reaches the journal or the caller.
func TestReview11AnswerHeaderNamesThatAreNoTokensNeverReachTheJournal(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"X-Tok\x80en", "X-\xffSecret", "Set-Cookie\xa0", "X-Token ", "X Token", "X-Tok\"en", "X-Tok(en)"} {
		t.Run(fmt.Sprintf("%q", name), func(t *testing.T) {
			t.Parallel()
			var n atomic.Int32
			srv := review11RawServer(t, "HTTP/1.1 201 Created\r\n"+name+": s3cret", &n)
			j := idem.NewMemoryJournal()
			c, err := idem.New(idem.Config{BaseURL: srv, Journal: j, Scope: "default",
				Retry: idem.RetryPolicy{MaxAttempts: 1, MaxStatusChecks: 1, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond}})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			res, err := c.Do(ctx, idem.Op{ID: "odd", URL: "/orders"})
			t.Logf("Do: %v", err)
			if err == nil {
				for k, vs := range res.Header {
					assert.NotContains(t, vs, "s3cret", "returned under %q", k)
				}
			}
			rec, lerr := j.Lookup(context.Background(), "default", "odd")
			require.NoError(t, lerr)
			if rec.Response != nil {
				for k, vs := range rec.Response.Header {
					assert.NotContains(t, vs, "s3cret", "journaled under %q", k)
				}
			}
		})
	}
}
