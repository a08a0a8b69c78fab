package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

// probeSecret is the credential the probed APIs demand; no output may
// hold it.
const probeSecret = "sk_test_5f2c9e_do_not_print"

// probeAPI is an endpoint "idem probe" is run against: a real HTTP server
// on 127.0.0.1 that demands X-Api-Key and counts every request it gets.
type probeAPI struct {
	srv      *httptest.Server
	requests atomic.Int64
}

func (a *probeAPI) url(path string) string { return a.srv.URL + path }

func newProbeAPI(t *testing.T, h http.Handler) *probeAPI {
	t.Helper()
	a := &probeAPI{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.requests.Add(1)
		if r.Header.Get("X-Api-Key") != probeSecret {
			// Echo what came, as a careless server might: the probe must
			// never print it.
			http.Error(w, "invalid API key "+r.Header.Get("X-Api-Key"), http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

// createOrder creates an order with a new ID on every run.
func createOrder() http.Handler {
	var n atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order_id":"ord_%d"}`, n.Add(1))
	})
}

// idemOrdersAPI is the server package's middleware in front of
// createOrder, reading the key from header ("" for the default), with the
// status endpoint.
func idemOrdersAPI(t *testing.T, header string) *probeAPI {
	t.Helper()
	mw, err := server.New(server.Config{Store: server.NewMemoryStore(), Scope: server.SingleTenant, Header: header})
	require.NoError(t, err)
	t.Cleanup(func() { mw.Close() })
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(createOrder()))
	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
	return newProbeAPI(t, mux)
}

const probeBody = `{"item":"book","quantity":1}`

// probeArgs is a full probe command line against a.
func probeArgs(a *probeAPI, extra ...string) []string {
	return append([]string{"probe", "--url", a.url("/orders"), "--body", probeBody,
		"--header-env", "X-Api-Key=PROBE_API_KEY", "--status-url", a.url("/idempotency/{key}")}, extra...)
}

var probeEnv = []string{"PROBE_API_KEY=" + probeSecret}

// requireNoSecret checks that the credential is in no output.
func requireNoSecret(t *testing.T, r result) {
	t.Helper()
	require.NotContains(t, r.stdout, probeSecret)
	require.NotContains(t, r.stderr, probeSecret)
	require.NotContains(t, r.stdout, "sk_test_")
	require.NotContains(t, r.stderr, "sk_test_")
}

var sentLine = regexp.MustCompile(`(\d+) of at most (\d+) requests sent`)

func TestProbeASafeAPI(t *testing.T) {
	t.Parallel()
	a := idemOrdersAPI(t, "")
	r := cli(t, "", probeEnv, probeArgs(a, "--yes")...)
	require.Equal(t, exitOK, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	require.Empty(t, r.stderr)
	requireNoSecret(t, r)
	for _, want := range []string{
		"step 1: sends 2 requests (the same key twice, in Idempotency-Key (bare))",
		"step 3: sends 2 requests (two requests with one key at once)",
		"step 5: sends 2 requests (the status endpoint",
		"replay          replayed",
		"POST 201 Idempotent-Replayed",
		"mismatch        key-conflict",
		"POST 422 urn:idem:problem:key-reused",
		"status          idem-format",
		"verdict: safe to use with idem",
		fmt.Sprintf("Status:    idem.StatusEndpoint(%q)", a.url("/idempotency")),
	} {
		require.Contains(t, r.stdout, want)
	}
	m := sentLine.FindStringSubmatch(r.stdout)
	require.NotNil(t, m, r.stdout)
	require.Equal(t, strconv.FormatInt(a.requests.Load(), 10), m[1], "the report counts what the server got")
	require.Equal(t, "20", m[2])
}

func TestProbeJSONReport(t *testing.T) {
	t.Parallel()
	a := idemOrdersAPI(t, "")
	r := cli(t, "", probeEnv, probeArgs(a, "--yes", "--json")...)
	require.Equal(t, exitOK, r.code, "stderr:\n%s", r.stderr)
	requireNoSecret(t, r)
	// stdout is the report alone; the steps are announced on stderr.
	var rep struct {
		Verdict  string `json:"verdict"`
		Complete bool   `json:"complete"`
		Requests int64  `json:"requests"`
		Findings []struct {
			Step      string           `json:"step"`
			Outcome   string           `json:"outcome"`
			Grade     string           `json:"grade"`
			Exchanges []map[string]any `json:"exchanges"`
		} `json:"findings"`
		Advice struct {
			Status string `json:"status"`
		} `json:"advice"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r.stdout)
	require.Equal(t, "safe", rep.Verdict)
	require.True(t, rep.Complete)
	require.Equal(t, a.requests.Load(), rep.Requests)
	require.Equal(t, fmt.Sprintf("idem.StatusEndpoint(%q)", a.url("/idempotency")), rep.Advice.Status)
	require.Equal(t, "replay", rep.Findings[0].Step)
	first := rep.Findings[0].Exchanges[1]
	require.Equal(t, "Idempotent-Replayed", first["replay_header"])
	require.Equal(t, "Idempotency-Key", first["key_header"])
	require.Contains(t, first, "duration_ms")
	require.Contains(t, r.stderr, "step 1: sends 2 requests")
	require.NotContains(t, r.stdout, "step 1:")
}

func TestProbeExitStatusFollowsTheVerdict(t *testing.T) {
	t.Parallel()
	t.Run("not safe", func(t *testing.T) {
		t.Parallel()
		a := newProbeAPI(t, createOrder())
		r := cli(t, "", probeEnv, probeArgs(a, "--yes")...)
		require.Equal(t, exitNotSafe, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
		requireNoSecret(t, r)
		require.Contains(t, r.stdout, "verdict: not safe: a key ran twice or is ignored")
		require.Contains(t, r.stdout, "replay          executed-twice  unsafe")
		require.Contains(t, r.stdout, "note: The key is ignored in Idempotency-Key and in X-Idempotency-Key (bare)")
		require.Equal(t, int64(4), a.requests.Load(), "two keys, two requests each; the later steps are skipped")
	})
	t.Run("usable with another header", func(t *testing.T) {
		t.Parallel()
		a := idemOrdersAPI(t, "X-Idempotency-Key")
		r := cli(t, "", probeEnv, probeArgs(a, "--yes", "--json")...)
		require.Equal(t, exitUsable, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
		requireNoSecret(t, r)
		var rep struct {
			Verdict string `json:"verdict"`
			Advice  struct {
				KeyHeader string `json:"key_header"`
			} `json:"advice"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep))
		require.Equal(t, "usable", rep.Verdict)
		require.Equal(t, "X-Idempotency-Key", rep.Advice.KeyHeader)
	})
}

func TestProbeWithoutYesSendsNothing(t *testing.T) {
	t.Parallel()
	a := idemOrdersAPI(t, "")
	r := cli(t, "", probeEnv, probeArgs(a)...)
	requireOneLineError(t, r, exitUsage, "add --yes to run it")
	require.Contains(t, r.stderr, "up to 20 real requests to POST "+a.url("/orders"))
	require.Zero(t, a.requests.Load())
}

func TestProbeBadInputsSendNothing(t *testing.T) {
	t.Parallel()
	a := idemOrdersAPI(t, "")
	body := filepath.Join(t.TempDir(), "body.json")
	require.NoError(t, os.WriteFile(body, []byte(probeBody), 0o600))
	u := a.url("/orders")
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no --url", []string{"probe", "--yes"}, exitUsage, "probe: --url is required"},
		{"relative --url", []string{"probe", "--url", "/orders", "--yes"}, exitUsage, `--url "/orders" must be an absolute http or https URL`},
		{"credentials in --url", []string{"probe", "--url", "http://u:" + probeSecret + "@127.0.0.1/orders", "--yes"}, exitUsage, "--url must not carry credentials"},
		{"both bodies", []string{"probe", "--url", u, "--body", "{}", "--body-file", body, "--yes"}, exitUsage, "give --body or --body-file, not both"},
		{"missing body file", []string{"probe", "--url", u, "--body-file", body + ".missing", "--yes"}, exitError, "--body-file: open"},
		{"budget below 2", []string{"probe", "--url", u, "--max-requests", "1", "--yes"}, exitUsage, "--max-requests must be at least 2"},
		{"status URL without {key}", []string{"probe", "--url", u, "--status-url", a.url("/idempotency"), "--yes"}, exitUsage, "must hold {key} once"},
		{"key header from the environment", []string{"probe", "--url", u, "--header-env", "Idempotency-Key=PROBE_API_KEY", "--yes"}, exitUsage, "Idempotency-Key is the idempotency key"},
		{"credential in the key header", []string{"probe", "--url", u, "--key-header", "X-Api-Key", "--header-env", "X-Api-Key=PROBE_API_KEY", "--yes"}, exitUsage, "Header sets X-Api-Key, which carries the probe's keys"},
		{"unset variable", []string{"probe", "--url", u, "--header-env", "X-Api-Key=PROBE_UNSET_VARIABLE", "--yes"}, exitError, "environment variable PROBE_UNSET_VARIABLE is unset or empty"},
		{"argument", []string{"probe", "--url", u, "extra", "--yes"}, exitUsage, `probe: unexpected argument "extra"`},
		{"bad method", []string{"probe", "--url", u, "--method", "PO ST", "--yes"}, exitUsage, `Method "PO ST" is not an HTTP method`},
	} {
		r := cli(t, "", probeEnv, tc.args...)
		requireOneLineError(t, r, tc.code, tc.want)
		requireNoSecret(t, r)
	}
	require.Zero(t, a.requests.Load(), "no bad command line sent anything")
}

func TestProbeStopsOnARefusedFirstRequestWithoutPrintingTheCredential(t *testing.T) {
	t.Parallel()
	a := idemOrdersAPI(t, "")
	// A wrong key: the server answers 401 and echoes it back.
	wrong := []string{"PROBE_API_KEY=sk_test_wrong_key_0001"}
	r := cli(t, "", wrong, probeArgs(a, "--yes")...)
	require.Equal(t, exitError, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	require.NotContains(t, r.stdout+r.stderr, "sk_test_wrong_key_0001")
	require.NotContains(t, r.stdout+r.stderr, "sk_test_")
	require.Contains(t, r.stderr, "answered HTTP 401 to the first request: the credentials are missing or refused")
	require.Contains(t, r.stderr, "[redacted]", "the echoed credential is blanked out")
	require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %q", r.stderr)
	require.Equal(t, int64(1), a.requests.Load(), "the probe stopped at the first answer")
}

func TestProbeBudgetTooSmall(t *testing.T) {
	t.Parallel()
	a := idemOrdersAPI(t, "")
	r := cli(t, "", probeEnv, probeArgs(a, "--yes", "--max-requests", "5")...)
	require.Equal(t, exitOK, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	require.Equal(t, int64(4), a.requests.Load())
	require.Contains(t, r.stdout, "4 of at most 5 requests sent")
	require.Contains(t, r.stdout, "concurrent: Not run (two requests with one key at once): it sends 2 requests, and 1 of the 5 allowed (MaxRequests) are left.")
	require.Contains(t, r.stdout, "some steps were skipped")
	require.NotContains(t, r.stdout, "step 3:")
}

func TestProbeIsInTheHelp(t *testing.T) {
	t.Parallel()
	r := cli(t, "", nil, "help")
	requireOK(t, r)
	require.Contains(t, r.stdout, "  probe      find out what an API does with idempotency keys")
	require.Contains(t, r.stdout, "4 probe: usable with changes")
	r = cli(t, "", nil, "help", "probe")
	requireOK(t, r)
	require.Contains(t, r.stdout, "--max-requests N")
}
