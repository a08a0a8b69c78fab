package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// countingServer answers 201 to everything and counts what reached it.
func countingServer(t *testing.T) (*httptest.Server, *atomic.Int32, *atomic.Value) {
	t.Helper()
	var n atomic.Int32
	var lastKey atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		lastKey.Store(r.Header.Get("Idempotency-Key"))
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	return srv, &n, &lastKey
}

func newClient(t *testing.T, cfg idem.Config) (*idem.Client, *idem.SQLiteJournal) {
	t.Helper()
	j := cfg.Journal
	var sj *idem.SQLiteJournal
	if j == nil {
		sj = openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
		cfg.Journal = sj
	} else {
		sj, _ = j.(*idem.SQLiteJournal)
	}
	c, err := idem.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c, sj
}

func countRecords(t *testing.T, j idem.Journal) int {
	t.Helper()
	n := 0
	for _, err := range j.List(context.Background(), idem.Filter{}) {
		require.NoError(t, err)
		n++
	}
	return n
}

func TestBadOpsAreRefusedBeforeAnythingIsJournaledOrSent(t *testing.T) {
	t.Parallel()
	srv, hits, _ := countingServer(t)
	withBase, j := newClient(t, idem.Config{BaseURL: srv.URL, SecretHeaders: []string{"X-Api-Key"}})
	noBase, j2 := newClient(t, idem.Config{})
	cases := []struct {
		name   string
		c      *idem.Client
		op     idem.Op
		target error
		says   string
	}{
		{"empty ID", withBase, idem.Op{URL: "/orders"}, idem.ErrInvalidOp, "Op.ID is empty"},
		{"oversized ID", withBase, idem.Op{ID: strings.Repeat("x", 600), URL: "/orders"}, idem.ErrInvalidOp, "limit is 512"},
		{"control characters in ID", withBase, idem.Op{ID: "a\nb", URL: "/orders"}, idem.ErrInvalidOp, "control characters"},
		{"ID not UTF-8", withBase, idem.Op{ID: "\xff\xfe", URL: "/orders"}, idem.ErrInvalidOp, "UTF-8"},
		{"ID not UTF-8 before its control characters", withBase, idem.Op{ID: "é\n\xff", URL: "/orders"}, idem.ErrInvalidOp, "UTF-8"},
		{"tab in ID", withBase, idem.Op{ID: "a\tb", URL: "/orders"}, idem.ErrInvalidOp, "control characters"},
		{"DEL in scope", withBase, idem.Op{Scope: "t\x7f", ID: "a", URL: "/orders"}, idem.ErrInvalidOp, "control characters"},
		{"DEL in a header value", withBase, idem.Op{ID: "a", URL: "/orders", Header: http.Header{"X-Note": {"ok", "a\x7f"}}}, idem.ErrInvalidOp, "control character"},
		{"NUL in a header value", withBase, idem.Op{ID: "a", URL: "/orders", Header: http.Header{"X-Note": {"a\x00b"}}}, idem.ErrInvalidOp, "control character"},
		{"Authorization header", withBase, idem.Op{ID: "a", URL: "/orders", Header: http.Header{"Authorization": {"Bearer s3cret"}}}, idem.ErrInvalidOp, "Config.Authorize"},
		{"Cookie header", withBase, idem.Op{ID: "a", URL: "/orders", Header: http.Header{"cookie": {"session=1"}}}, idem.ErrInvalidOp, "Cookie"},
		{"Proxy-Authorization header", withBase, idem.Op{ID: "a", URL: "/orders", Header: http.Header{"Proxy-Authorization": {"Basic x"}}}, idem.ErrInvalidOp, "credential"},
		{"configured secret header", withBase, idem.Op{ID: "a", URL: "/orders", Header: http.Header{"X-Api-Key": {"k"}}}, idem.ErrInvalidOp, "X-Api-Key"},
		{"key header set by the caller", withBase, idem.Op{ID: "a", URL: "/orders", Header: http.Header{"Idempotency-Key": {"mine"}}}, idem.ErrInvalidOp, "sets the idempotency key itself"},
		{"relative URL without BaseURL", noBase, idem.Op{ID: "a", URL: "/orders"}, idem.ErrInvalidOp, "BaseURL is not set"},
		{"credentials in the URL", withBase, idem.Op{ID: "a", URL: "http://user:pw@127.0.0.1/orders"}, idem.ErrInvalidOp, "user credentials"},
		{"another origin than BaseURL", withBase, idem.Op{ID: "a", URL: "http://127.0.0.2:9/orders?token=s3cret"}, idem.ErrInvalidOp, "use a client whose BaseURL is that origin"},
		{"not http", withBase, idem.Op{ID: "a", URL: "ftp://127.0.0.1/x"}, idem.ErrInvalidOp, "not http or https"},
		{"bad method", withBase, idem.Op{ID: "a", Method: "PO ST", URL: "/orders"}, idem.ErrInvalidOp, "not an HTTP method"},
		{"body above the journal's limit", withBase, idem.Op{ID: "a", URL: "/orders", Body: make([]byte, idem.DefaultMaxBodySize+1)}, idem.ErrBodyTooLarge, "limit is"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := c.c.Do(context.Background(), c.op)
			assert.Nil(t, res)
			require.ErrorIs(t, err, c.target)
			assert.Contains(t, err.Error(), c.says)
			_, err = c.c.Begin(context.Background(), c.op)
			assert.ErrorIs(t, err, c.target, "Begin refuses it too")
		})
	}
	assert.Zero(t, hits.Load(), "nothing may be sent")
	assert.Zero(t, countRecords(t, j), "nothing may be journaled")
	assert.Zero(t, countRecords(t, j2))
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	j := idem.NewMemoryJournal()
	for name, cfg := range map[string]idem.Config{
		"no journal":               {},
		"relative base URL":        {Journal: j, BaseURL: "/api"},
		"base URL with creds":      {Journal: j, BaseURL: "https://u:p@api.example.com"},
		"negative retention":       {Journal: j, Retention: -1},
		"negative resume interval": {Journal: j, ResumeInterval: -1},
		"bad scope":                {Journal: j, Scope: "a\x00b"},
		"unknown key kind":         {Journal: j, Keys: 9},
	} {
		_, err := idem.New(cfg)
		assert.ErrorIs(t, err, idem.ErrInvalidConfig, name)
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	base := idem.Fingerprint("POST", "https://api/x", nil, nil, []byte("{}"))
	assert.Len(t, base, 64)
	assert.Equal(t, base, idem.Fingerprint("POST", "https://api/x", http.Header{"X-Trace": {"1"}}, nil, []byte("{}")),
		"headers not marked significant do not count")
	for name, fp := range map[string]string{
		"method": idem.Fingerprint("PUT", "https://api/x", nil, nil, []byte("{}")),
		"url":    idem.Fingerprint("POST", "https://api/y", nil, nil, []byte("{}")),
		"body":   idem.Fingerprint("POST", "https://api/x", nil, nil, []byte("{ }")),
		"significant header": idem.Fingerprint("POST", "https://api/x", http.Header{"Content-Type": {"text/plain"}},
			[]string{"content-type"}, []byte("{}")),
		"field boundaries": idem.Fingerprint("POS", "Thttps://api/x", nil, nil, []byte("{}")),
	} {
		assert.NotEqual(t, base, fp, "a different %s must change the fingerprint", name)
	}
}

func TestKeys(t *testing.T) {
	t.Parallel()
	srv, _, lastKey := countingServer(t)
	ctx := context.Background()
	keyOf := func(c *idem.Client, id string) uuid.UUID {
		res, err := c.Do(ctx, idem.Op{ID: id, URL: "/orders"})
		require.NoError(t, err)
		assert.Equal(t, res.Key, lastKey.Load(), "the journaled key is the one sent")
		u, err := uuid.Parse(res.Key)
		require.NoError(t, err)
		return u
	}
	random, _ := newClient(t, idem.Config{BaseURL: srv.URL})
	a, b := keyOf(random, "a"), keyOf(random, "b")
	assert.Equal(t, uuid.Version(4), a.Version())
	assert.NotEqual(t, a, b)

	ordered, _ := newClient(t, idem.Config{BaseURL: srv.URL, Keys: idem.KeyTimeOrdered})
	assert.Equal(t, uuid.Version(7), keyOf(ordered, "a").Version())

	// Two clients on two journals (a machine that lost its journal) mint
	// the same deterministic key for the same scope and ID.
	ns := uuid.New() // the application's own namespace
	det1, _ := newClient(t, idem.Config{BaseURL: srv.URL, Keys: idem.KeyDeterministic, KeyNamespace: ns})
	det2, _ := newClient(t, idem.Config{BaseURL: srv.URL, Keys: idem.KeyDeterministic, KeyNamespace: ns})
	k1, k2 := keyOf(det1, "payroll/2026-11/emp-7"), keyOf(det2, "payroll/2026-11/emp-7")
	assert.Equal(t, uuid.Version(5), k1.Version())
	assert.Equal(t, k1, k2)
	assert.NotEqual(t, k1, keyOf(det1, "payroll/2026-11/emp-8"))
	other, _ := newClient(t, idem.Config{BaseURL: srv.URL, Keys: idem.KeyDeterministic, KeyNamespace: ns, Scope: "tenant-b"})
	assert.NotEqual(t, k1, keyOf(other, "payroll/2026-11/emp-7"), "the scope is part of a deterministic key")
	// Another application, with a namespace of its own, cannot compute
	// this application's keys from the scope and ID.
	otherApp, _ := newClient(t, idem.Config{BaseURL: srv.URL, Keys: idem.KeyDeterministic, KeyNamespace: uuid.New()})
	assert.NotEqual(t, k1, keyOf(otherApp, "payroll/2026-11/emp-7"), "the namespace is part of a deterministic key")
}

func TestQuotedKeyHeader(t *testing.T) {
	t.Parallel()
	got := make(chan string, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("X-Request-Key")
		w.WriteHeader(201)
	}))
	defer srv.Close()
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, KeyHeader: "x-request-key", QuoteKey: true})
	res, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/"})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, `"`+res.Key+`"`, <-got)
}

// Journaled fingerprints must keep their meaning across versions: a change
// of the formula would refuse every resumed operation as another request.
// The value is what the formula of the first release computes.
func TestFingerprintIsStable(t *testing.T) {
	t.Parallel()
	got := idem.Fingerprint("POST", "https://api.example.com/orders", http.Header{"Content-Type": {"application/json"}},
		[]string{"content-type"}, []byte(`{"a":1}`))
	assert.Equal(t, "fc4950fe1fe769d3a47bff8a0085e8ed734bbc2e58e15d44662e9f5e1acc9a0b", got)
	// Several significant headers, named in any case and twice, one of them
	// with two values and one absent; and none at all, nor a body.
	h := http.Header{"Content-Type": {"application/json"}, "X-Tenant": {"a", "b"}, "Accept": {"*/*"}}
	got = idem.Fingerprint("PUT", "https://api.example.com/orders/1?x=1", h,
		[]string{"x-tenant", "Content-Type", "X-Missing", "content-type"}, []byte(`{"a":1}`))
	assert.Equal(t, "a5869335eade223f32c1af15cb61f3a50b77497cb372da392f747ae9e5f681e8", got)
	assert.Equal(t, "3d0ccf1361683350d9b031828e19cff859c1c48552be107d1cd0473004811969",
		idem.Fingerprint("POST", "/o", nil, nil, nil))
}

// The client remembers the last URL it resolved: each operation still goes
// to its own, and a bad one after a good one is still refused.
func TestEachOperationGoesToItsOwnURL(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var paths []string
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})
	c, _ := newClient(t, idem.Config{Journal: idem.NewMemoryJournal(), BaseURL: srv.URL + "/api/"})
	ctx := context.Background()
	for i, u := range []string{"orders", "payments", "payments", "orders", srv.URL + "/elsewhere"} {
		res, err := c.Do(ctx, idem.Op{ID: fmt.Sprint("op-", i), URL: u})
		require.NoError(t, err)
		assert.Equal(t, idem.StateSucceeded, res.State)
	}
	_, err := c.Do(ctx, idem.Op{ID: "bad", URL: "ftp://example.com/x"})
	require.ErrorIs(t, err, idem.ErrInvalidOp)
	_, err = c.Do(ctx, idem.Op{ID: "good-again", URL: "orders"})
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"/api/orders", "/api/payments", "/api/payments", "/api/orders", "/elsewhere", "/api/orders"}, paths)
}

// TestOpNamesAndValuesTheChecksAllow: what the checks of an Op's names
// and header values read byte by byte must still let through: an ID and a
// scope in UTF-8 beyond ASCII, a header value with a tab.
func TestOpNamesAndValuesTheChecksAllow(t *testing.T) {
	t.Parallel()
	srv, hits, _ := countingServer(t)
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL})
	res, err := c.Do(context.Background(), idem.Op{Scope: "tenant-ü", ID: "commande/é-世界", URL: "/orders",
		Header: http.Header{"X-Note": {"a\tb"}}})
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, res.StatusCode)
	assert.Equal(t, int32(1), hits.Load())
}
