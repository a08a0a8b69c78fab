package main

import (
	"bufio"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A non-loopback --listen without a token is a usage error: nothing is
// served.
func TestUIRefusesANonLoopbackAddressWithoutAToken(t *testing.T) {
	t.Parallel()
	path, _ := standardJournal(t)
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:8080", "ops.example:8080"} {
		r := idemOn(t, path, "ui", "--listen", addr)
		requireOneLineError(t, r, exitUsage, "is not a loopback address")
		assert.Contains(t, r.stderr, "--token-env NAME", addr)
	}
	requireOneLineError(t, idemOn(t, path, "ui", "--listen", "nonsense"), exitUsage, "want host:port")
	r := cli(t, "", []string{"UI_TOKEN="}, "--journal", path, "ui", "--listen", "0.0.0.0:0", "--token-env", "UI_TOKEN")
	requireOneLineError(t, r, exitError, "environment variable UI_TOKEN is unset or empty")
	requireOneLineError(t, idemOn(t, path, "ui", "extra"), exitUsage, `unexpected argument "extra"`)
}

// uiProcess is a running "idem ui".
type uiProcess struct {
	cmd    *exec.Cmd
	url    string
	first  string // the line it printed
	stderr *strings.Builder
}

// startUI runs "idem ui" with args and waits for the URL it prints.
func startUI(t *testing.T, env []string, args ...string) *uiProcess {
	t.Helper()
	cmd := exec.Command(idemBin, append([]string{"ui"}, args...)...)
	cmd.Env = append(childEnv(), env...)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	p := &uiProcess{cmd: cmd, stderr: &strings.Builder{}}
	cmd.Stderr = p.stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "stderr: %s", p.stderr)
	go func() { _, _ = io.Copy(io.Discard, out) }()
	p.first = line
	m := regexp.MustCompile(`on (http://[^ ]+/) `).FindStringSubmatch(line)
	require.NotNil(t, m, "the first line names the URL: %q", line)
	p.url = m[1]
	return p
}

// stop interrupts it as Ctrl-C does and returns its exit status.
func (p *uiProcess) stop(t *testing.T) int {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("idem ui did not stop on SIGINT")
	}
	return p.cmd.ProcessState.ExitCode()
}

func httpGet(t *testing.T, url string, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header = header
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// "idem ui" serves on a free loopback port, prints its URL, serves the
// journal and stops cleanly on Ctrl-C.
func TestUIServesTheJournalAndStops(t *testing.T) {
	t.Parallel()
	path, recs := standardJournal(t)
	p := startUI(t, nil, "--journal", path)
	assert.Regexp(t, `^idem ui: serving journal .* on http://127\.0\.0\.1:\d+/ \(read-only, loopback only\); Ctrl-C stops it\n$`, p.first)
	code, body := httpGet(t, p.url+"ops?state=unknown", nil)
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, recs[rUnknown].Key)
	assert.NotContains(t, body, recs[rPending].Key)
	code, body = httpGet(t, p.url+"op?key="+recs[rUnknown].Key, nil)
	assert.Equal(t, http.StatusOK, code)
	assert.NotContains(t, body, `action="/op/reconcile"`, "read-only without --allow-writes")
	assert.Equal(t, exitOK, p.stop(t), "stderr: %s", p.stderr)
	assert.Empty(t, p.stderr.String())
}

// On a non-loopback address with a token, every request needs the
// token, which is printed nowhere.
func TestUIWithATokenOnAllInterfaces(t *testing.T) {
	t.Parallel()
	const token = "tok-8c1f0e2a9b"
	path, _ := standardJournal(t)
	p := startUI(t, []string{"UI_TOKEN=" + token}, "--journal", path, "--listen", "0.0.0.0:0", "--token-env", "UI_TOKEN", "--allow-writes")
	assert.Contains(t, p.first, "(writes allowed, token required)")
	port := regexp.MustCompile(`:(\d+)/$`).FindStringSubmatch(p.url)[1]
	base := "http://127.0.0.1:" + port + "/"
	code, body := httpGet(t, base, nil)
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.Contains(t, body, `action="/login"`)
	code, _ = httpGet(t, base, http.Header{"Authorization": {"Bearer " + token}})
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, exitOK, p.stop(t))
	assert.NotContains(t, p.first, token)
	assert.NotContains(t, p.stderr.String(), token)
}
