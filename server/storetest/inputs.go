package storetest

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

// input is a claim's identity and route as a request can bring them to a
// store: the middleware passes them as it got them, so a store keeps
// whatever bytes they hold.
type input struct {
	scope, key, fp, method, path string
}

// jwt is a scope as long as an identity token a Config.Scope may return:
// 3 KB that do not compress, well over the 2,704 bytes a PostgreSQL B-tree
// entry may hold.
var jwt = func() string {
	var b strings.Builder
	b.WriteString("eyJhbGciOiJSUzI1NiJ9.")
	sum := sha256.Sum256([]byte("storetest"))
	for b.Len() < 3000 {
		b.WriteString(base64.RawURLEncoding.EncodeToString(sum[:]))
		sum = sha256.Sum256(sum[:])
	}
	return b.String()
}()

// odd are inputs that the middleware passes to its store unchanged, each
// of which a store must keep byte for byte.
var odd = map[string]input{
	// GET /files/caf%E9.txt: r.URL.Path is the decoded Latin-1 byte.
	"PathNotUTF8":  {"tenant", "k1", "fp", "POST", "/files/caf\xe9.txt"},
	"PathWithNUL":  {"tenant", "k1", "fp", "POST", "/files/a\x00b"},
	"ScopeNotUTF8": {"t\xff\xfe-\xc3", "k1", "fp", "POST", "/orders"},
	"ScopeWithNUL": {"tenant\x00a", "k1", "fp", "POST", "/orders"},
	"LongScope":    {jwt, "k1", "fp", "POST", "/orders"},
	// Config.MaxKeyLength may allow keys longer than the default 255.
	"LongKey":             {"tenant", strings.Repeat("k", 4096), "fp", "POST", "/orders"},
	"KeyNotUTF8":          {"tenant", "k\xff1", "fp", "POST", "/orders"},
	"FingerprintNotUTF8":  {"tenant", "k1", "fp\xff\x00", "POST", "/orders"},
	"MethodNotUTF8":       {"tenant", "k1", "fp", "P\xffST", "/orders"},
	"LongPath":            {"tenant", "k1", "fp", "POST", "/" + strings.Repeat("segment/", 2048)},
	"EverythingOddAtOnce": {jwt + "\xff\x00", strings.Repeat("\xe9", 3000), "fp\x00", "POST", "/caf\xe9/\x00"},
}

var inputTests = func() []test {
	var tests []test
	for name, in := range odd {
		tests = append(tests, test{name, func(t *testing.T, s server.Store) { lifecycleOf(t, s, in) }})
	}
	tests = append(tests,
		test{"LongScopesDifferingInTheirLastByteAreTwoScopes", func(t *testing.T, s server.Store) {
			// A store that keys long values by a prefix, or by a hash
			// it does not check, would confuse these.
			a := mustClaim(t, s, claimAt(jwt+"a", "k1", "fp-a", t0))
			b := mustClaim(t, s, claimAt(jwt+"b", "k1", "fp-b", t0))
			assert.NotEqual(t, a.Token, b.Token)
			assert.Equal(t, "fp-a", mustGet(t, s, jwt+"a", "k1", t0).Fingerprint)
			assert.Equal(t, "fp-b", mustGet(t, s, jwt+"b", "k1", t0).Fingerprint)
			requireAbsent(t, s, jwt, "k1", t0)
		}},
		test{"ResponseHeaderNotUTF8", func(t *testing.T, s server.Store) {
			// A handler's header value may hold obs-text, which HTTP
			// allows and net/http sends as is (a Content-Disposition with a
			// Latin-1 file name): a retry replays it byte for byte.
			c := mustClaim(t, s, claimAt("tenant", "k1", "fp", t0))
			want := response("x")
			want.Header.Set("Content-Disposition", "attachment; filename=\"caf\xe9.txt\"")
			want.Header.Set("X-Legacy", "a\x00b\xff\xfe")
			want.Header["X-Caf\xe9"] = []string{"\xc3"}
			require.NoError(t, s.Complete(ctx, complete("tenant", "k1", c.Token, want, t0)))
			e := mustGet(t, s, "tenant", "k1", t0)
			assertResponse(t, want, e.Response)
			require.NotNil(t, e.Response)
			assert.Equal(t, []byte("attachment; filename=\"caf\xe9.txt\""), []byte(e.Response.Header.Get("Content-Disposition")))
		}},
		test{"BytesAreNotNormalized", func(t *testing.T, s server.Store) {
			// "é" precomposed and decomposed, and its Latin-1 byte: three
			// scopes, since a store compares bytes, not text.
			for i, scope := range []string{"caf\u00e9", "cafe\u0301", "caf\xe9"} {
				mustClaim(t, s, claimAt(scope, "k1", fmt.Sprint("fp", i), t0))
			}
			for i, scope := range []string{"caf\u00e9", "cafe\u0301", "caf\xe9"} {
				assert.Equal(t, fmt.Sprint("fp", i), mustGet(t, s, scope, "k1", t0).Fingerprint, "scope %q", scope)
			}
		}},
	)
	return tests
}()

// lifecycleOf runs every operation of a Store on an entry claimed with in,
// and checks that each reads back what was given, byte for byte.
func lifecycleOf(t *testing.T, s server.Store, in input) {
	t.Helper()
	req := claimAt(in.scope, in.key, in.fp, t0)
	req.Method, req.Path = in.method, in.path
	same := func(what string, e server.Entry) {
		t.Helper()
		// %q, so that a mismatch shows the bytes.
		assert.Equal(t, fmt.Sprintf("%q", in.scope), fmt.Sprintf("%q", e.Scope), "%s: Scope", what)
		assert.Equal(t, fmt.Sprintf("%q", in.key), fmt.Sprintf("%q", e.Key), "%s: Key", what)
		assert.Equal(t, fmt.Sprintf("%q", in.fp), fmt.Sprintf("%q", e.Fingerprint), "%s: Fingerprint", what)
		assert.Equal(t, fmt.Sprintf("%q", in.method), fmt.Sprintf("%q", e.Method), "%s: Method", what)
		assert.Equal(t, fmt.Sprintf("%q", in.path), fmt.Sprintf("%q", e.Path), "%s: Path", what)
	}

	c, err := s.Claim(ctx, req)
	require.NoError(t, err, "a store keeps any scope, key and route the middleware passes it")
	require.True(t, c.Claimed)
	same("Claim", c.Entry)
	same("Get", mustGet(t, s, in.scope, in.key, t0))

	again, err := s.Claim(ctx, req)
	require.NoError(t, err)
	assert.False(t, again.Claimed, "the second claim finds the first one's entry")
	same("the second Claim's entry", again.Entry)

	later := t0.Add(lockTimeout / 2)
	require.NoError(t, s.Renew(ctx, in.scope, in.key, c.Token, later))
	assertTime(t, later, mustGet(t, s, in.scope, in.key, later).LockedAt, "Renew")

	// A take-over of the stale lock, then a completion with its token.
	stale := later.Add(2 * lockTimeout)
	req.Now, req.ExpiresAt, req.StaleBefore = stale, stale.Add(retention), stale.Add(-lockTimeout)
	took, err := s.Claim(ctx, req)
	require.NoError(t, err)
	require.True(t, took.Claimed && took.TookOver, "a stale lock is taken over")
	same("the take-over", took.Entry)
	require.ErrorIs(t, s.Complete(ctx, complete(in.scope, in.key, c.Token, response("late"), stale)), server.ErrLockLost)
	want := response("done \xe9\x00")
	require.NoError(t, s.Complete(ctx, complete(in.scope, in.key, took.Token, want, stale)))
	e := mustGet(t, s, in.scope, in.key, stale)
	same("Get after Complete", e)
	assert.Equal(t, server.Completed, e.State)
	assertResponse(t, want, e.Response)

	// Past its retention: replaced by a new claim, then released.
	gone := stale.Add(retention)
	requireAbsent(t, s, in.scope, in.key, gone)
	req.Now, req.ExpiresAt, req.StaleBefore = gone, gone.Add(retention), gone.Add(-lockTimeout)
	fresh := mustClaim(t, s, req)
	assert.False(t, fresh.TookOver)
	same("the replacing claim", fresh.Entry)
	require.NoError(t, s.Release(ctx, in.scope, in.key, fresh.Token))
	requireAbsent(t, s, in.scope, in.key, gone)

	// Swept once expired.
	last := mustClaim(t, s, req)
	require.NoError(t, s.Complete(ctx, complete(in.scope, in.key, last.Token, want, gone)))
	n, err := s.Sweep(ctx, gone.Add(retention))
	require.NoError(t, err)
	assert.Equal(t, 1, n, "Sweep deletes the expired entry")
	requireAbsent(t, s, in.scope, in.key, gone)
}
