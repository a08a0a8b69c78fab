package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/examples/server/orders"
	"github.com/idemkit/idem/internal/testserver"
	"github.com/idemkit/idem/internal/wire"
)

// The tests run ordersd as a real child process (this test binary again,
// with ORDERSD_ARGS set), so that SIGKILL kills it as it would kill the
// real command.
func TestMain(m *testing.M) {
	if args := os.Getenv("ORDERSD_ARGS"); args != "" {
		var list []string
		if err := json.Unmarshal([]byte(args), &list); err != nil {
			panic(err)
		}
		os.Args = append([]string{"ordersd"}, list...)
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

type daemon struct {
	url  string
	cmd  *exec.Cmd
	done chan error
}

// start runs ordersd on the store and orders files in dir.
func start(t *testing.T, dir string, args ...string) *daemon {
	t.Helper()
	args = append([]string{"-addr", "127.0.0.1:0",
		"-store", filepath.Join(dir, "keys.db"), "-orders", filepath.Join(dir, "orders.db")}, args...)
	enc, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ORDERSD_ARGS="+string(enc))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	d := &daemon{cmd: cmd, done: make(chan error, 1)}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, out)
		d.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-d.done
	})
	select {
	case line, ok := <-lines:
		require.True(t, ok, "ordersd exited before listening")
		require.True(t, strings.HasPrefix(line, "listening http://"), "first line: %q", line)
		d.url = strings.TrimPrefix(line, "listening ")
	case <-time.After(30 * time.Second):
		t.Fatal("ordersd did not start listening")
	}
	return d
}

func (d *daemon) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGKILL))
	<-d.done
	d.done <- nil // for the cleanup
}

type reply struct {
	status int
	header http.Header
	body   string
}

func (d *daemon) post(ctx context.Context, key, body string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url+"/orders", strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Idempotency-Key", key)
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}, err
}

func (d *daemon) mustPost(t *testing.T, key, body string) reply {
	t.Helper()
	r, err := d.post(context.Background(), key, body)
	require.NoError(t, err)
	return r
}

func (d *daemon) state(t *testing.T, key string) string {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(d.url + "/idempotency/" + key)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	s, _, err := wire.DecodeStatus(resp.StatusCode, b, key)
	require.NoError(t, err)
	return s.State
}

const order = `{"item":"book","quantity":1}`

func TestReplayAfterSIGKILLAndRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	d := start(t, dir)
	first := d.mustPost(t, "k1", order)
	require.Equal(t, http.StatusCreated, first.status, first.body)
	d.kill(t)

	d = start(t, dir)
	again := d.mustPost(t, "k1", order)
	assert.Equal(t, http.StatusCreated, again.status)
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"), "the stored response survived the SIGKILL")
	assert.Equal(t, first.body, again.body)
	assert.Equal(t, wire.StateCompleted, d.state(t, "k1"))
	next := d.mustPost(t, "k2", order)
	assert.Contains(t, next.body, `"order_id":"ord_2"`)
}

// TestCrashBetweenOrderAndStoredResponse kills ordersd after the order is
// committed and before the middleware stores the response: the entry is
// left in progress. Once its lock is stale the status says not_found, the
// retry runs the handler again, and the orders table's UNIQUE guard answers
// with the order the dead run created.
func TestCrashBetweenOrderAndStoredResponse(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// The first run's lock timeout only paces its heartbeat; the restarted
	// server's decides when the dead run's lock is stale.
	d := start(t, dir, "-delay-after", "1h", "-lock-timeout", "1m")
	go d.post(context.Background(), "k", order) //nolint:errcheck // dies with the server

	app, err := orders.New(filepath.Join(dir, "orders.db"))
	require.NoError(t, err)
	defer app.Close()
	require.Eventually(t, func() bool {
		n, err := app.TotalOrders(context.Background())
		return err == nil && n == 1
	}, 30*time.Second, 5*time.Millisecond, "the order is committed")
	assert.Equal(t, wire.StateProcessing, d.state(t, "k"))
	d.kill(t)

	d = start(t, dir, "-lock-timeout", "300ms")
	require.Eventually(t, func() bool { return d.state(t, "k") == wire.StateNotFound }, 30*time.Second, 10*time.Millisecond,
		"a dead handler's lock goes stale and reads as not_found")
	r := d.mustPost(t, "k", order)
	assert.Equal(t, http.StatusCreated, r.status)
	assert.Empty(t, r.header.Get("Idempotent-Replayed"), "the handler ran again")
	assert.Contains(t, r.body, `"order_id":"ord_1"`, "and found the first run's order")
	n, err := app.TotalOrders(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, n, "no second order")
	assert.True(t, d.mustPost(t, "k", order).header.Get("Idempotent-Replayed") == "true")
}

func TestSIGTERMShutsDownCleanly(t *testing.T) {
	t.Parallel()
	d := start(t, t.TempDir())
	d.mustPost(t, "k", order)
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	err := <-d.done
	d.done <- nil
	assert.NoError(t, err, "ordersd exits 0 on SIGTERM")
}

func TestBadFlagsFail(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	err := testserver.Daemon(context.Background(), []string{"-store", filepath.Join(dir, "missing", "keys.db"), "-orders", filepath.Join(dir, "orders.db")}, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "keys.db")
}

// TestRequestChecks: with a custom key header, the quoted form and a token
// per tenant, ordersd refuses a key in another header or form and a
// credential of another tenant, runs nothing for them, and writes one audit
// line per request, which a SIGKILL does not cut.
func TestRequestChecks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	audit := filepath.Join(dir, "audit.log")
	d := start(t, dir, "-key-header", "x-request-key", "-key-quoted",
		"-tenant-tokens", "tenant-a=tok-a,tenant-b=tok-b", "-audit", audit)
	send := func(method, path string, header http.Header, body string) reply {
		t.Helper()
		req, err := http.NewRequest(method, d.url+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header = header
		tr := &http.Transport{DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return reply{resp.StatusCode, resp.Header, string(b)}
	}
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Add(kv[i], kv[i+1])
		}
		return out
	}
	const k = "k1"
	cases := []struct {
		name   string
		method string
		path   string
		header http.Header
		status int
		audit  string
	}{
		{"right header, form and token", "POST", "/orders",
			h("X-Request-Key", `"k1"`, "X-Tenant", "tenant-a", "Authorization", "Bearer tok-a"), http.StatusCreated,
			"POST orders tenant-a header=ok token=ok"},
		{"the default header", "POST", "/orders",
			h("Idempotency-Key", k, "X-Tenant", "tenant-a", "Authorization", "Bearer tok-a"), http.StatusBadRequest,
			"POST orders tenant-a header=other:Idempotency-Key token=ok"},
		{"both headers", "POST", "/orders",
			h("X-Request-Key", `"k1"`, "Idempotency-Key", `"k1"`, "X-Tenant", "tenant-a", "Authorization", "Bearer tok-a"), http.StatusBadRequest,
			"POST orders tenant-a header=other:Idempotency-Key token=ok"},
		{"a bare key", "POST", "/orders",
			h("X-Request-Key", k, "X-Tenant", "tenant-a", "Authorization", "Bearer tok-a"), http.StatusBadRequest,
			"POST orders tenant-a header=bare token=ok"},
		{"no key", "POST", "/orders",
			h("X-Tenant", "tenant-a", "Authorization", "Bearer tok-a"), http.StatusBadRequest,
			"POST orders tenant-a header=missing token=ok"},
		{"another tenant's token", "POST", "/orders",
			h("X-Request-Key", `"k2"`, "X-Tenant", "tenant-b", "Authorization", "Bearer tok-a"), http.StatusForbidden,
			"POST orders tenant-b header=ok token=of:tenant-a"},
		{"no token", "POST", "/orders",
			h("X-Request-Key", `"k2"`, "X-Tenant", "tenant-b"), http.StatusForbidden,
			"POST orders tenant-b header=ok token=none"},
		{"no tenant", "POST", "/orders",
			h("X-Request-Key", `"k2"`, "Authorization", "Bearer tok-b"), http.StatusForbidden,
			"POST orders default header=ok token=of:tenant-b"},
		{"status, right form and token", "GET", "/idempotency/k1",
			h("X-Request-Key", `"k1"`, "X-Tenant", "tenant-a", "Authorization", "Bearer tok-a"), http.StatusOK,
			"GET status tenant-a header=ok token=ok"},
		{"status, another key in the header", "GET", "/idempotency/k1",
			h("X-Request-Key", `"k2"`, "X-Tenant", "tenant-a", "Authorization", "Bearer tok-a"), http.StatusBadRequest,
			"GET status tenant-a header=mismatch token=ok"},
		{"status, the default header", "GET", "/idempotency/k1",
			h("Idempotency-Key", "k1", "X-Tenant", "tenant-a", "Authorization", "Bearer tok-a"), http.StatusBadRequest,
			"GET status tenant-a header=other:Idempotency-Key token=ok"},
		{"status, another tenant's token", "GET", "/idempotency/k1",
			h("X-Request-Key", `"k1"`, "X-Tenant", "tenant-a", "Authorization", "Bearer tok-b"), http.StatusForbidden,
			"GET status tenant-a header=ok token=of:tenant-b"},
	}
	var want []string
	for _, c := range cases {
		r := send(c.method, c.path, c.header, order)
		assert.Equal(t, c.status, r.status, "%s: %s", c.name, r.body)
		want = append(want, c.audit)
	}
	d.kill(t)

	app, err := orders.New(filepath.Join(dir, "orders.db"))
	require.NoError(t, err)
	defer app.Close()
	n, err := app.TotalOrders(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, n, "a refused request runs nothing")
	b, err := os.ReadFile(audit)
	require.NoError(t, err)
	assert.Equal(t, want, strings.Split(strings.TrimSuffix(string(b), "\n"), "\n"), "one audit line per request, in order")

	// Without the flags, nothing is checked and nothing is written.
	plain := start(t, t.TempDir())
	req, err := http.NewRequest("POST", plain.url+"/orders", strings.NewReader(order))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", k)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	assert.Equal(t, http.StatusCreated, resp.StatusCode, "the default: Idempotency-Key, bare, no credential")
}

func TestBadTenantTokensFail(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, v := range []string{"a", "a=", "=t", "a=t,a=u", "a=t u"} {
		err := testserver.Daemon(context.Background(), []string{"-tenant-tokens", v,
			"-store", filepath.Join(dir, "keys.db"), "-orders", filepath.Join(dir, "orders.db")}, io.Discard)
		require.Error(t, err, v)
		assert.Contains(t, err.Error(), "-tenant-tokens", v)
	}
}

// TestExecLog: -exec-log records the handler's one run of a key, and the
// response that followed it, and nothing for a replay; the file survives a
// SIGKILL and the next life appends to it.
func TestExecLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	log := filepath.Join(dir, "exec.log")
	d := start(t, dir, "-exec-log", log)
	first := d.mustPost(t, "k1", order)
	require.Equal(t, http.StatusCreated, first.status, first.body)
	again := d.mustPost(t, "k1", order)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	d.kill(t)
	d = start(t, dir, "-exec-log", log)
	require.Equal(t, http.StatusCreated, d.mustPost(t, "k2", order).status)
	d.kill(t)

	b, err := os.ReadFile(log)
	require.NoError(t, err)
	tn := orders.DefaultTenant
	assert.Equal(t, "run "+tn+" k1\ndone "+tn+" k1 201\nanswered "+tn+" k1\n"+
		"run "+tn+" k2\ndone "+tn+" k2 201\nanswered "+tn+" k2\n", string(b))
	info, err := os.Stat(log)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
}
