package otel_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemkit/idem/internal/testserver"
)

// shownAttrs are the attributes traceText prints, in this order.
var shownAttrs = []string{"idem.operation.scope", "idem.key.hash", "idem.attempt", "idem.verdict", "idem.written",
	"http.response.status_code", "error.type", "idem.status_check", "idem.status.state",
	"idem.status.stored_status_code", "idem.outcome", "idem.state", "idem.attempts", "idem.status_checks", "idem.settled_by"}

// traceText prints spans as an indented tree, children in the order they
// started: name, duration, and the attributes worth reading. With
// durations false it prints the names alone, for a test to compare.
func traceText(spans []sdktrace.ReadOnlySpan, durations bool) string {
	children := map[string][]sdktrace.ReadOnlySpan{}
	ids := map[string]bool{}
	for _, s := range spans {
		ids[s.SpanContext().SpanID().String()] = true
	}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if p := s.Parent().SpanID().String(); s.Parent().IsValid() && ids[p] {
			children[p] = append(children[p], s)
		} else {
			roots = append(roots, s)
		}
	}
	byStart := func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) }
	var b strings.Builder
	var print func(s sdktrace.ReadOnlySpan, depth int)
	print = func(s sdktrace.ReadOnlySpan, depth int) {
		fmt.Fprintf(&b, "%s%s", strings.Repeat("  ", depth), s.Name())
		if durations {
			fmt.Fprintf(&b, "  %.1f ms", float64(s.EndTime().Sub(s.StartTime()))/float64(time.Millisecond))
			a := attrs(s)
			for _, k := range shownAttrs {
				if v, ok := a[k]; ok {
					fmt.Fprintf(&b, "  %s=%s", k, v.Emit())
				}
			}
			if d := s.Status().Description; d != "" {
				fmt.Fprintf(&b, "  status=Error(%s)", d)
			}
		}
		b.WriteString("\n")
		kids := children[s.SpanContext().SpanID().String()]
		slices.SortFunc(kids, byStart)
		for _, k := range kids {
			print(k, depth+1)
		}
	}
	slices.SortFunc(roots, byStart)
	for _, r := range roots {
		print(r, 0)
	}
	return b.String()
}

// TestTraceAsText prints the trace of a lost response settled by a status
// check, as README.md shows it:
//
//	go test -run TestTraceAsText -v .
func TestTraceAsText(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	srv := tel.startServer(t)
	c, _ := newClient(t, srv, tel.clientHooks())
	srv.Inject(testserver.DropAfterCommit)
	_, err := c.Do(t.Context(), orderOp("checkout/cart-42", 1))
	require.NoError(t, err)
	spans := tel.waitSpans(t, 5)
	assert.Equal(t, `idem.do POST
  idem.attempt
    POST /orders
  idem.status_check
    GET /idempotency/{key}
`, traceText(spans, false))
	t.Log("\n" + traceText(spans, true))
}
