package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// The workers are os.Executable(): in a test, this test binary, so the
// worker mode must be reachable from here too.
func TestMain(m *testing.M) {
	if isWorker() {
		if err := workerMain(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, &out)
	text := out.String()
	t.Log("\n" + text)
	require.NoError(t, err)

	assert.Contains(t, text, "worker-1 ended: signal: killed.")
	// worker-1's four orders were taken over before their leases lapsed,
	// because its session is gone, and finished by asking the shop, not by ordering again.
	takeovers := regexp.MustCompile(`(?m)^   orders/\d\d: worker-[23] finished it, the status endpoint said HTTP 201 \(order ord_\d+\); worker-[23] took it over \(taken over from worker-1#[0-9a-f]{8}: its owner is gone\)$`).FindAllString(text, -1)
	assert.Len(t, takeovers, 4, "worker-1's four operations")
	finished := regexp.MustCompile(`(?m)^   orders/\d\d: worker-([23]) finished it`).FindAllStringSubmatch(text, -1)
	assert.Len(t, finished, 12, "every operation finished by the surviving workers")
	assert.Equal(t, 8, strings.Count(text, "finished it, the shop answered"), "the other eight were sent once and answered")
	assert.Contains(t, text, "12 operations, 12 orders on the server.")
}
