package main

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
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

	// 1. The answer was lost, the status endpoint gave back the first order.
	assert.Regexp(t, `checkout/cart-42: new → in_flight\n`, text)
	assert.Regexp(t, `checkout/cart-42: in_flight → unknown \(sent, then: .+\)\n`, text)
	assert.Regexp(t, `checkout/cart-42: unknown → succeeded \(HTTP 201\)\n`, text)
	first := regexp.MustCompile(`(?m)^   → order (ord_\d+), key ([0-9a-f-]{36}), replayed: true$`).FindStringSubmatch(text)
	require.NotNil(t, first, "step 1 prints the order, its key and replayed: true")
	assert.Equal(t, "ord_1", first[1])
	assert.Contains(t, text, "The shop saw 1 POST /orders and 1 status request")
	// The journal is gone at the end, and the demo says how to keep it.
	assert.Contains(t, text, "go run ./examples/checkout -journal /tmp/ops.db", "the demo names its -journal flag")
	assert.Contains(t, text, "(cd cmd/idem && go run . --journal /tmp/ops.db ls)")

	// 2. The same key and order, from the journal, nothing sent.
	second := regexp.MustCompile(`(?m)^   → order (ord_\d+), key ([0-9a-f-]{36}), from the journal: POST /orders requests at the shop: (\d+) before, (\d+) after$`).FindStringSubmatch(text)
	require.NotNil(t, second, "step 2 prints the journaled result")
	assert.Equal(t, first[1], second[1], "the same order")
	assert.Equal(t, first[2], second[2], "the same key")
	assert.Equal(t, second[3], second[4], "no request sent")

	// 3. Interrupted mid-request, journaled, finished by Resume after the
	// restart with a status check and no second order.
	// (The reason is "context canceled", unless a very slow machine let
	// the attempt time out first: the story is the same.)
	assert.Regexp(t, `checkout/cart-43: in_flight → unknown \(.+\)\n`, text)
	assert.Contains(t, text, "Do returned ErrOutcomeUnknown")
	journaled := regexp.MustCompile(`journal: checkout/cart-43, key ([0-9a-f-]{36}), state (in_flight|unknown) after 1 attempt`).FindStringSubmatch(text)
	require.NotNil(t, journaled, "the restarted client finds the operation unsettled in the journal")
	assert.Regexp(t, `key `+journaled[1][:8]+`… checkout/cart-43: unknown → succeeded \(HTTP 201\)\n`, text)
	assert.Contains(t, text, "Resume: claimed 1, succeeded 1, rejected 0, still pending 0, still unknown 0, expired 0, failed 0")
	resumed := regexp.MustCompile(`→ order (ord_\d+), key ([0-9a-f-]{36}); Resume asked the status endpoint \((\d+) status request\) and sent (\d+) POST /orders`).FindStringSubmatch(text)
	require.NotNil(t, resumed)
	assert.Equal(t, "ord_2", resumed[1])
	assert.Equal(t, journaled[1], resumed[2], "the same key before and after the restart")
	assert.NotEqual(t, first[2], resumed[2], "another operation, another key")
	assert.Equal(t, "1", resumed[3])
	assert.Equal(t, "0", resumed[4], "Resume did not re-send the order")

	// 4. The shop's own count.
	assert.Contains(t, text, "2 orders placed, 1 refused: 2 orders on the server.")
	assert.Contains(t, text, "→ ErrRejected: HTTP 400, quantity must be an integer")
	again := regexp.MustCompile(`Do again: ErrRejected from the journal, HTTP 400; POST /orders requests at the shop: (\d+) before, (\d+) after`).FindStringSubmatch(text)
	if assert.NotNil(t, again) {
		assert.Equal(t, again[1], again[2], "a refusal is never sent again")
	}
}

func TestRunRefusesAnExistingJournal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ops.db")
	*journalFlag = path
	defer func() { *journalFlag = "" }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	require.NoError(t, run(ctx, &out), "a new journal file is created and kept")
	assert.FileExists(t, path)
	assert.Contains(t, out.String(), "The journal is kept in "+path, "the demo says where its journal is")
	assert.Contains(t, out.String(), "(cd cmd/idem && go run . --journal "+path+" ui)")
	// The command it prints names a main package where it says: the CLI's
	// module, from the repository's root.
	list := exec.Command("go", "list", "-f", "{{.Name}}", ".")
	list.Dir = filepath.Join("..", "..", "cmd", "idem")
	name, err := list.CombinedOutput()
	require.NoError(t, err, "%s", name)
	assert.Equal(t, "main", strings.TrimSpace(string(name)))
	err = run(ctx, &out)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "already exists")
}

// run must stop every goroutine it starts (servers, clients, journals).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
