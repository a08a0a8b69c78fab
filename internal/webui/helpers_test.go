package webui

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/uitest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fixture.dir != "" {
		_ = os.RemoveAll(fixture.dir)
	}
	// Every handler, journal and test server must have stopped its
	// goroutines.
	if err := goleak.Find(); code == 0 && err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		code = 1
	}
	os.Exit(code)
}

// fixture is uitest's journal, built once (it takes a second of real
// Retry-After) and copied for each test that writes.
var fixture struct {
	once sync.Once
	dir  string
	f    uitest.Fixture
	err  error
}

// fixtureJournal returns a private copy of the fixture journal, and its
// operations' keys.
func fixtureJournal(t *testing.T) (string, map[string]string) {
	t.Helper()
	fixture.once.Do(func() {
		fixture.dir, fixture.err = os.MkdirTemp("", "idem-webui-fixture-")
		if fixture.err != nil {
			return
		}
		// Built within the first test that needs it: the test server
		// it runs stops with that test; the journal is closed by then.
		fixture.f = uitest.Build(t, filepath.Join(fixture.dir, "ops.db"))
	})
	require.NoError(t, fixture.err)
	path := filepath.Join(t.TempDir(), "ops.db")
	for _, suffix := range []string{"", "-wal"} {
		src, err := os.ReadFile(fixture.f.Path + suffix)
		if suffix != "" && os.IsNotExist(err) {
			continue
		}
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path+suffix, src, 0o600))
	}
	return path, fixture.f.Keys
}

// openJournal opens the journal at path as idem ui does.
func openJournal(t *testing.T, path string) *idem.SQLiteJournal {
	t.Helper()
	j, err := idem.OpenSQLite(path, idem.SQLiteMustExist())
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	return j
}

// server serves the view of cfg (its journal opened at path) on a real
// loopback server, and returns a client with a cookie jar.
func server(t *testing.T, cfg Config) (*httptest.Server, *http.Client) {
	t.Helper()
	h, err := New(cfg)
	require.NoError(t, err)
	return serve(t, h)
}

// serve serves h on a real loopback server, and returns a client with a
// cookie jar.
func serve(t *testing.T, h *Handler) (*httptest.Server, *http.Client) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	t.Cleanup(c.CloseIdleConnections)
	return srv, c
}

type answer struct {
	code   int
	header http.Header
	body   string
}

func get(t *testing.T, c *http.Client, u string) answer {
	t.Helper()
	return do(t, c, http.MethodGet, u, nil, nil)
}

func post(t *testing.T, c *http.Client, u string, form url.Values) answer {
	t.Helper()
	return do(t, c, http.MethodPost, u, form, nil)
}

func do(t *testing.T, c *http.Client, method, u string, form url.Values, header http.Header) answer {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(context.Background(), method, u, body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

// csrfOf is the CSRF token a page's forms carry.
func csrfOf(t *testing.T, page string) string {
	t.Helper()
	const mark = `name="csrf" value="`
	i := strings.Index(page, mark)
	require.GreaterOrEqual(t, i, 0, "the page has no CSRF field")
	rest := page[i+len(mark):]
	return rest[:strings.IndexByte(rest, '"')]
}

// stateOf reads an operation's state from the journal at path.
func stateOf(t *testing.T, j idem.Journal, key string) idem.Record {
	t.Helper()
	rec, err := j.Get(context.Background(), key)
	require.NoError(t, err)
	return rec
}
