package main

import (
	"bytes"
	"context"
	"fmt"
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

	// Run 1 is stopped half-way; run 2 makes only the other half; run 3,
	// on an empty journal, sends every key again and the server replays.
	assert.Contains(t, text, "stopped after 10 payments: context canceled")
	assert.Contains(t, text, "this run: 10 paid\n")
	assert.Contains(t, text, "this run: 10 from the journal, 10 paid\n")
	assert.Contains(t, text, "this run: 20 replayed by the server\n")
	counts := regexp.MustCompile(`requests to the payments service: (\d+); payments on the server: (\d+)`).FindAllStringSubmatch(text, -1)
	require.Len(t, counts, 3)
	assert.Equal(t, []string{"10", "10"}, counts[0][1:], "run 1")
	assert.Equal(t, []string{"10", "20"}, counts[1][1:], "run 2 sends only the payments not made")
	assert.Equal(t, []string{"20", "20"}, counts[2][1:], "run 3 sends every key and pays nobody twice")

	// Every employee: one key in all runs (run checks it), and the
	// expected outcome per run.
	keys := map[string]bool{}
	for n := 1; n <= 20; n++ {
		want := `paid\s+from the journal\s+replayed by the server`
		if n > 10 {
			want = `-\s+paid\s+replayed by the server`
		}
		row := regexp.MustCompile(fmt.Sprintf(`(?m)^   emp-%d\s+[\d,]+\.\d\d EUR\s+([0-9a-f]{8})…\s+%s$`, n, want)).FindStringSubmatch(text)
		if assert.NotNil(t, row, "emp-%d", n) {
			keys[row[1]] = true
		}
	}
	assert.Len(t, keys, 20, "one key per payment")
	assert.Contains(t, text, "20 employees, 20 payments on the server.")
}

// run must stop every goroutine it starts (servers, clients, journals).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
