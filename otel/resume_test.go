package otel_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
	idemotel "github.com/idemkit/idem/otel"
)

// What the crash worker is told, and what it sends.
const (
	envJournal   = "IDEM_OTEL_CHILD_JOURNAL"
	envServerURL = "IDEM_OTEL_CHILD_URL"
	crashToken   = "tok-secret-crash-7731"
)

func init() { children["crash-worker"] = crashWorker }

func crashOp() idem.Op { return orderOp("checkout/cart-crash-4711", 3) }

// crashWorker is a process that dies mid-call: it opens the journal, does
// one operation with the otel hooks inside an application span whose trace
// ID it prints first, and waits for an answer the server holds until the
// parent SIGKILLs it. Its spans die with it, unexported: what is left of
// its trace is the link journaled with the operation.
func crashWorker() error {
	j, err := idem.OpenSQLite(os.Getenv(envJournal))
	if err != nil {
		return err
	}
	tp := sdktrace.NewTracerProvider()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: os.Getenv(envServerURL), Owner: "crash-worker",
		AttemptTimeout: 10 * time.Minute,
		Hooks:          idemotel.ClientHooks(idemotel.WithTracerProvider(tp), idemotel.WithPropagator(propagation.TraceContext{})),
		Authorize: func(r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+crashToken)
			return nil
		}})
	if err != nil {
		return err
	}
	ctx, span := tp.Tracer("checkout-app").Start(context.Background(), "checkout")
	fmt.Printf("trace %s\n", span.SpanContext().TraceID())
	_, err = c.Do(ctx, crashOp())
	return fmt.Errorf("Do returned (%v): the worker should have been killed first", err)
}

// startChild runs child name of this test binary with env, its stdout
// piped to the test; the test's cleanup kills it if the test did not.
func startChild(t *testing.T, name string, env ...string) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+name), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, bufio.NewReader(out)
}

var traceparentRE = regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-0[01]$`)

func TestResumeAfterACrashLinksTheOriginalTrace(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	srv := tel.startServer(t)
	path := filepath.Join(t.TempDir(), "ops.db")
	// The server commits the order and holds its answer until the client
	// goes away.
	srv.Inject(testserver.HoldPastTimeout)
	worker, out := startChild(t, "crash-worker", envJournal+"="+path, envServerURL+"="+srv.URL)
	line, err := out.ReadString('\n')
	require.NoError(t, err, "the worker said nothing")
	childTrace, ok := strings.CutPrefix(strings.TrimSpace(line), "trace ")
	require.True(t, ok, "the worker said %q", line)
	require.Eventually(t, func() bool { return srv.TotalOrders() == 1 }, time.Minute, 5*time.Millisecond,
		"the worker's order never reached the server")
	require.NoError(t, worker.Process.Kill()) // SIGKILL, mid-call
	var exit *exec.ExitError
	require.ErrorAs(t, worker.Wait(), &exit)
	assert.Equal(t, "signal: killed", exit.String())

	j, err := idem.OpenSQLite(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	rec, err := j.Lookup(t.Context(), "default", crashOp().ID)
	require.NoError(t, err)
	assert.Equal(t, idem.StateInFlight, rec.State, "the worker died with the operation on the wire")
	// Nothing secret was journaled: the headers are the operation's own,
	// without the credential or the trace context, and the link is a bare
	// traceparent of the worker's trace.
	assert.Equal(t, http.Header{"Content-Type": {"application/json"}}, rec.Header)
	m := traceparentRE.FindStringSubmatch(rec.Link)
	require.NotNil(t, m, "the link is a W3C traceparent: %q", rec.Link)
	assert.Equal(t, childTrace, m[1], "the link names the worker's trace")
	assert.Equal(t, []string{childTrace}, traceIDs(tel.traceparentsOf("POST /orders")),
		"the worker's request carried its trace to the server")

	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.StatusURL),
		Retry: fastRetry(), Hooks: tel.clientHooks()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	report, err := c.Resume(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 1, report.Succeeded)
	assert.Equal(t, 1, srv.TotalOrders(), "settled by a status check, not sent again")

	// The held request's server span, the resume call, its status check
	// and the status request's server span.
	spans := tel.waitSpans(t, 4)
	resumed := one(t, spans, "idem.resume POST")
	require.Len(t, resumed.Links(), 1)
	link := resumed.Links()[0].SpanContext
	assert.Equal(t, childTrace, link.TraceID().String(), "the resumed span links to the original trace")
	assert.Equal(t, m[2], link.SpanID().String(), "to the span of the call that created the operation")
	assert.NotEqual(t, childTrace, resumed.SpanContext().TraceID().String(), "linked, not parented: a trace of its own")
	ra := attrs(resumed)
	assert.True(t, strings.HasPrefix(ra["idem.lease.taken_from"].AsString(), "crash-worker"),
		"the dead worker's lease was taken over: %q", ra["idem.lease.taken_from"].AsString())
	assert.Equal(t, "resume", ra["idem.call"].AsString())
	assert.Equal(t, idemotel.KeyHash("default", rec.Key), ra["idem.key.hash"].AsString())
	assert.Equal(t, "succeeded", ra["idem.state"].AsString())
	assert.Equal(t, "status_check", ra["idem.settled_by"].AsString())
	assert.Equal(t, int64(0), ra["idem.attempts"].AsInt64(), "nothing was sent again")
	check := one(t, spans, "idem.status_check")
	assert.True(t, isChildOf(check, resumed))
	assert.Equal(t, "completed", attrs(check)["idem.status.state"].AsString())

	assert.Equal(t, int64(1), tel.count(t, "idem.client.lease.takeovers", attribute.String("idem.operation.scope", "default")))
	assert.Equal(t, int64(1), tel.count(t, "idem.client.settlements", attribute.String("idem.settled_by", "status_check")))
	assert.Equal(t, int64(1), tel.count(t, "idem.client.operations", attribute.String("idem.call", "resume"),
		attribute.String("idem.state", "succeeded")))
	tel.assertNothingSecret(t, append(secretsOf(crashOp(), rec.Key), crashToken))
}

// traceIDs returns the trace IDs of traceparent headers.
func traceIDs(headers []string) []string {
	ids := make([]string, len(headers))
	for i, h := range headers {
		if m := traceparentRE.FindStringSubmatch(h); m != nil {
			ids[i] = m[1]
		}
	}
	return ids
}
