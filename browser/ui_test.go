package browser

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/uitest"
	"github.com/idemkit/idem/internal/webui"
)

// The tests run the idem binary, which go test's cache does not see;
// importing the view makes a change in it re-run them. (.ci/run passes
// -count=1 as well, for the command's own files.)
var _ = webui.DefaultPageSize

// idemBin is the idem binary, built once by TestMain.
var idemBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idem-browser-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	idemBin = filepath.Join(dir, "idem")
	// cmd/idem is a module of its own (it imports the postgres module):
	// build it there, against this repository's root and postgres modules,
	// with its go.work named: a GOWORK=off (or another workspace) the
	// tests run under would leave its go.mod asking for releases.
	cmdDir, err := filepath.Abs(filepath.Join("..", "cmd", "idem"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	build := exec.Command("go", "build", "-o", idemBin, ".")
	build.Dir = cmdDir
	build.Env = append(os.Environ(), "GOWORK="+filepath.Join(cmdDir, "go.work"))
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the idem binary:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// chromium is the browser's path; the test skips without it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("chromium is not installed: the browser tests of idem ui need it (apt-get install -y chromium; .ci/run installs it)")
	return ""
}

// ui is a running "idem ui".
type ui struct {
	cmd *exec.Cmd
	url string
}

// startUI runs "idem ui" on the journal jt with args, and returns once it
// has printed its URL. t.Cleanup stops it as Ctrl-C does.
func startUI(t *testing.T, jt journalUnderTest, args ...string) *ui {
	t.Helper()
	cmd := exec.Command(idemBin, append(append(jt.args, "ui"), args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		assert.Equal(t, 0, cmd.ProcessState.ExitCode(), "idem ui's exit status; stderr: %s", stderr.String())
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	go func() {
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
		close(exited)
	}()
	require.NoError(t, err, "idem ui printed no URL; stderr: %s", stderr.String())
	m := regexp.MustCompile(`on (http://[^ ]+)/ `).FindStringSubmatch(line)
	require.NotNil(t, m, "no URL in %q", line)
	return &ui{cmd: cmd, url: m[1]}
}

// tab is a headless Chromium tab for one test.
type tab struct {
	t   *testing.T
	ctx context.Context
}

// browse starts a headless Chromium for the test, with the flags a
// machine without network wants and the test's own; t.Cleanup stops it.
func browse(t *testing.T, extra ...chromedp.ExecAllocatorOption) *tab {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1400, 1000),
		chromedp.UserDataDir(t.TempDir()),
	}
	opts = append(opts, extra...)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelB()
		cancelA()
	})
	// The first call starts the browser, bound to ctx: no timeout on it.
	require.NoError(t, chromedp.Do(ctx), "starting chromium")
	return &tab{t: t, ctx: ctx}
}

// stepTimeout bounds one step: a page that never shows what is awaited
// fails the test instead of hanging it.
const stepTimeout = time.Minute

func run[T any](tb *tab, a chromedp.Action[T]) T {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	require.NoError(tb.t, err)
	return v
}

func (tb *tab) do(steps ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	run(tb, chromedp.Steps(steps...))
}

// eventually waits until the expression is true in the tab, through a
// navigation (whose evaluations fail while it goes on).
func (tb *tab) eventually(expr string) {
	tb.t.Helper()
	deadline := time.Now().Add(stepTimeout)
	for {
		ctx, cancel := context.WithTimeout(tb.ctx, 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		cancel()
		if err == nil && ok {
			return
		}
		require.True(tb.t, time.Now().Before(deadline), "waiting for %s: %v", expr, err)
		time.Sleep(50 * time.Millisecond)
	}
}

// open loads path and waits for sel to show.
func (tb *tab) open(u, sel string) {
	tb.t.Helper()
	tb.do(chromedp.Navigate(u), chromedp.WaitVisible(chromedp.CSS(sel)))
}

func (tb *tab) text(sel string) string {
	tb.t.Helper()
	return run(tb, chromedp.Text(chromedp.CSS(sel)))
}

func (tb *tab) count(sel string) int {
	tb.t.Helper()
	return run(tb, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
}

// pwned is what the fixture's hostile scripts and handlers set when they
// run: window.pwned, nil when none ran.
func (tb *tab) pwned() any {
	tb.t.Helper()
	return run(tb, chromedp.Evaluate[any](`window.pwned === undefined ? null : window.pwned`))
}

func (tb *tab) screenshot(dir, name string) {
	tb.t.Helper()
	png := run(tb, chromedp.FullScreenshot(100))
	require.NoError(tb.t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
}

// shots is where the test writes its screenshots, kept after the test
// for a reviewer.
func shots(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "idem-ui-screenshots-")
	require.NoError(t, err)
	t.Logf("screenshots of idem ui: %s", dir)
	return dir
}

// An operator, in Chromium: the overview; the list, filtered; an
// operation and its timeline; a reconcile with --allow-writes; hostile
// content that never runs; and the page following the journal while
// another process writes it.
func TestOperatorInABrowser(t *testing.T) {
	for _, kind := range journalKinds {
		t.Run(kind.name, func(t *testing.T) { operatorInABrowser(t, kind.make) })
	}
}

func operatorInABrowser(t *testing.T, make func(*testing.T) (journalUnderTest, uitest.Fixture)) {
	b := browse(t)
	jt, f := make(t)
	u := startUI(t, jt, "--allow-writes")
	dir := shots(t)

	// The overview.
	b.open(u.url+"/", "#total")
	assert.Equal(t, "12", b.text("#total"))
	assert.Equal(t, "2", b.text("#count-unknown"))
	assert.Contains(t, b.text("#oldest"), "pay/invoice-7")
	assert.Contains(t, b.text("#scopes"), uitest.MarkupScope, "the hostile scope shows as text")
	assert.Nil(t, b.pwned(), "a hostile script ran on the overview")
	b.screenshot(dir, "1-overview")

	// The list, then filtered by state and by text in the ID.
	b.open(u.url+"/ops", "#ops")
	assert.Equal(t, 12, b.count("#ops tbody tr"))
	assert.Contains(t, b.text("#ops"), uitest.MarkupID, "the hostile ID shows as text")
	assert.Nil(t, b.pwned(), "a hostile script ran in the list")
	b.screenshot(dir, "2-list")
	b.do(chromedp.Click(chromedp.CSS(`input[name="state"][value="unknown"]`)),
		chromedp.SendKeys(chromedp.CSS("#q"), "invoice"),
		chromedp.Click(chromedp.CSS(`#filter button[type="submit"]`)))
	b.eventually(`location.search.includes("q=invoice") && document.readyState === "complete"`)
	loc := run(b, chromedp.Location())
	assert.Contains(t, loc, "state=unknown")
	assert.Equal(t, 2, b.count("#ops tbody tr"))
	assert.Contains(t, b.text("#ops"), "pay/invoice-7")
	assert.Contains(t, b.text("#ops"), "pay/invoice-8")
	b.screenshot(dir, "3-list-filtered")

	// An operation: its fields and its timeline.
	b.do(chromedp.Click(chromedp.CSS(`#ops a[href*="`+f.Keys[uitest.Unknown]+`"]`)),
		chromedp.WaitVisible(chromedp.CSS("#timeline svg")))
	assert.Equal(t, "unknown", b.text("#state"))
	assert.Equal(t, 1, b.count("#timeline g.attempt"), "one attempt")
	assert.Equal(t, 1, b.count("#timeline g.status-failed"), "one failed status check")
	assert.Equal(t, 1, b.count("#timeline g.wait"), "waiting since the answer was lost")
	b.screenshot(dir, "4-operation-unknown")

	// Reconcile it: refused without a note, then done.
	b.do(chromedp.Click(chromedp.CSS(`#reconcile input[value="succeeded"]`)),
		chromedp.Click(chromedp.CSS(`#reconcile button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#error")))
	assert.Contains(t, b.text("#error"), "the note is required")
	b.do(chromedp.SendKeys(chromedp.CSS(`#reconcile input[name="note"]`), "matched order ord_5 in the ERP"),
		chromedp.Click(chromedp.CSS(`#reconcile button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#done")))
	assert.Equal(t, "succeeded", b.text("#state"))
	assert.Equal(t, "matched order ord_5 in the ERP", b.text("#note"))
	assert.Equal(t, 0, b.count("#reconcile"), "a settled operation has no form")
	assert.Equal(t, 1, b.count("#timeline g.event-operator"), "the decision is on the timeline")
	b.screenshot(dir, "5-operation-reconciled")
	rec := lookup(t, jt, f.Keys[uitest.Unknown])
	assert.Equal(t, idem.StateSucceeded, rec.State)
	assert.Equal(t, "matched order ord_5 in the ERP", rec.Note)

	// A richer timeline: a 503, a Retry-After wait, a second attempt.
	b.open(u.url+"/op?key="+f.Keys[uitest.SucceededWait], "#timeline svg")
	assert.Equal(t, 2, b.count("#timeline g.attempt"))
	assert.Equal(t, 1, b.count("#timeline g.wait"))
	b.screenshot(dir, "6-operation-retry-after")

	// Hostile operations: shown as text, nothing runs.
	for _, name := range []string{uitest.HostileMarkup, uitest.HostileBytes, uitest.HostileLong} {
		b.open(u.url+"/op?key="+f.Keys[name], "#fields")
		assert.Nil(t, b.pwned(), "a hostile script ran on %s's page", name)
		assert.Equal(t, 0, b.count("img"), "%s: no element from the journal's markup", name)
		assert.Equal(t, 1, b.count("script"), "%s: live.js only", name)
		assert.Equal(t, 0, b.count("#fields b"), "%s: no element from the journal's markup", name)
	}
	assert.Contains(t, b.text("#op-id"), "long/A<b>A<b>", "the long ID, as text")
	b.open(u.url+"/op?key="+f.Keys[uitest.HostileMarkup], "#fields")
	assert.Equal(t, uitest.MarkupID, b.text("#op-id"))
	assert.Contains(t, b.text("#request-body"), uitest.MarkupBody)
	b.screenshot(dir, "7-operation-hostile")

	// Live: the overview follows what another process writes.
	b.open(u.url+"/", "#total")
	assert.Equal(t, "12", b.text("#total"))
	app := jt.open(t)
	_, _, err := app.Create(context.Background(), idem.Record{Key: "0b9b9f0e-7b1c-4d0a-9a59-3d0c6a1f2e11", Scope: "default",
		ID: "written/while-watching", Method: "POST", URL: "https://api.example.com/orders", Fingerprint: "f",
		KeyHeader: "Idempotency-Key", State: idem.StatePending})
	require.NoError(t, err)
	require.NoError(t, app.Close())
	b.do(chromedp.Poll[chromedp.Void](`document.getElementById("total").textContent === "13"`,
		chromedp.WithPollingTimeout(30*time.Second)))
	assert.NotEmpty(t, run(b, chromedp.Evaluate[string](`document.getElementById("live").dataset.refreshed || ""`)),
		"live.js swapped the live part in, without a reload")
}

// Without --allow-writes the forms are absent, and a POST forged from
// the page itself (with its cookies) is refused.
func TestReadOnlyInABrowser(t *testing.T) {
	for _, kind := range journalKinds {
		t.Run(kind.name, func(t *testing.T) { readOnlyInABrowser(t, kind.make) })
	}
}

func readOnlyInABrowser(t *testing.T, make func(*testing.T) (journalUnderTest, uitest.Fixture)) {
	b := browse(t)
	jt, f := make(t)
	u := startUI(t, jt)
	dir := shots(t)

	b.open(u.url+"/op?key="+f.Keys[uitest.Unknown], "#fields")
	assert.Equal(t, 0, b.count("form#reconcile"))
	assert.Equal(t, 0, b.count("form.settle"))
	assert.Equal(t, "read-only", b.text("#mode"))
	b.screenshot(dir, "8-operation-read-only")

	forge := fmt.Sprintf(`fetch("/op/reconcile", {method: "POST", credentials: "same-origin",
		body: new URLSearchParams({key: %q, as: "succeeded", note: "forged"})})
		.then(async r => [r.status, await r.text()])`, f.Keys[uitest.Unknown])
	res := run(b, chromedp.Evaluate[[]any](forge, chromedp.EvalAwaitPromise))
	require.Len(t, res, 2)
	assert.Equal(t, float64(http.StatusForbidden), res[0])
	assert.Contains(t, res[1], "read-only")
	assert.Equal(t, idem.StateUnknown, lookup(t, jt, f.Keys[uitest.Unknown]).State)

	// And outside the browser, a POST with no cookie at all.
	resp, err := http.PostForm(u.url+"/op/cancel", url.Values{"key": {f.Keys[uitest.Pending]}})
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Equal(t, idem.StatePending, lookup(t, jt, f.Keys[uitest.Pending]).State)
}

// lookup reads an operation from the journal, as another process would.
func lookup(t *testing.T, jt journalUnderTest, key string) idem.Record {
	t.Helper()
	j := jt.open(t)
	defer j.Close()
	rec, err := j.Get(context.Background(), key)
	require.NoError(t, err)
	return rec
}
