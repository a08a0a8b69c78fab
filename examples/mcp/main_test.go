package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// run starts os.Executable() as the runtime: in a test, that is this test
// binary, so the child mode must be reachable from here too.
func TestMain(m *testing.M) {
	if isRuntime() {
		if err := runtimeMain(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "runtime:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, &out)
	text := out.String()
	t.Log("\n" + text)
	require.NoError(t, err)

	// The answer to call_9a1 was lost after the ticket was opened: the
	// Caller sent it again with the same key, and the server replayed it.
	lost := regexp.MustCompile(`key ([0-9a-f]{8})… call_9a1: in_flight → unknown \(sent, then: .*EOF\)\n`).FindStringSubmatch(text)
	require.NotNil(t, lost, "call_9a1's answer was lost: an unknown outcome")
	assert.Regexp(t, `key `+lost[1]+`… call_9a1: unknown → succeeded \(HTTP 200\)\n`, text)

	// The runtime was killed during call_b37, which the journal held, with
	// no credential; Resume finished it.
	assert.Contains(t, text, "app | step 3:")
	assert.Contains(t, text, "The process ended: signal: killed.")
	assert.NotContains(t, text, "the transcript is done")
	assert.Contains(t, text, `the journal: call_b37 is in_flight: POST http://office-tools.mcp.invalid/tools/send_email {"to":"shipping-team","template":"ticket-opened"}, key `)
	assert.Contains(t, text, "…, no credential\n")
	assert.Contains(t, text, "Resume: claimed 1, succeeded 1, unknown 0")

	// Each call's result, as the killed runtime got it and as the
	// restarted one replayed it from the journal: the same.
	results := map[string][]string{}
	for _, m := range regexp.MustCompile(`(?m)^   (?:app \|    )?(call_\w+) (\w+) → (\{.*\})`).FindAllStringSubmatch(text, -1) {
		results[m[1]] = append(results[m[1]], m[3])
	}
	for call, want := range map[string][]string{
		"call_8f2": {`{"message_id":"msg_001","status":"sent"}`, `{"message_id":"msg_001","status":"sent"}`},
		"call_9a1": {`{"status":"open","ticket_id":"TCK-1001"}`, `{"status":"open","ticket_id":"TCK-1001"}`},
		"call_b37": {`{"message_id":"msg_002","status":"sent"}`}, // the killed runtime never got it
	} {
		assert.Equal(t, want, results[call], call)
	}
	assert.Contains(t, text, "tools/call requests sent during the replay: 0")

	// The server's own count: each tool ran once per tool-call ID.
	assert.Contains(t, text, "3 tool calls, 3 runs of the tools (create_ticket 1, send_email 2)")
	for _, call := range []string{"call_8f2 send_email", "call_9a1 create_ticket", "call_b37 send_email"} {
		assert.Regexp(t, call+`: key [0-9a-f]{8}…, the tool ran 1 time\(s\) under it\n`, text)
	}
}
