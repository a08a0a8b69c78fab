package main

import (
	"bytes"
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, &out)
	text := out.String()
	t.Log("\n" + text)
	require.NoError(t, err)

	// The step timed out with create_ticket on the wire; its retry settled
	// it from the status endpoint, with the same key.
	timedOut := regexp.MustCompile(`key ([0-9a-f]{8})… tool/call_9a1: in_flight → unknown \(.*context canceled\)\n`).FindStringSubmatch(text)
	require.NotNil(t, timedOut, "call_9a1 was interrupted with an unknown outcome")
	assert.Regexp(t, `key `+timedOut[1]+`… tool/call_9a1: unknown → succeeded \(HTTP 200\)\n`, text)
	assert.Contains(t, text, "Step 2 failed: call_9a1 has an unknown outcome")

	// Each tool call's result, as first returned and as replayed.
	results := map[string][]string{}
	for _, m := range regexp.MustCompile(`(?m)^   (call_\w+) (\w+) → (\{.*\})$`).FindAllStringSubmatch(text, -1) {
		results[m[1]] = append(results[m[1]], m[3])
	}
	for call, want := range map[string]string{
		"call_8f2": `{"message_id":"msg_001","status":"sent"}`,
		"call_9a1": `{"ticket_id":"TCK-1001","status":"open"}`,
		"call_b37": `{"message_id":"msg_002","status":"sent"}`,
	} {
		require.Len(t, results[call], 2, "%s: returned once, then once on the replay", call)
		assert.Equal(t, want, results[call][0], call)
		assert.Equal(t, want, results[call][1], "%s: the replay returns the original result", call)
	}
	assert.Contains(t, text, "Tool requests sent during the replay: 0")

	// The tool service's own count: every tool ran once per call.
	assert.Contains(t, text, "3 tool calls, 3 executions on the tool service (create_ticket 1, send_email 2).")
}

// run must stop every goroutine it starts (servers, clients, journals).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
