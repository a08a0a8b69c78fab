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
	"go.uber.org/goleak"
)

// run starts os.Executable() as the application: in a test, that is this
// test binary, so the child mode must be reachable from here too.
func TestMain(m *testing.M) {
	if isApplication() {
		if err := applicationMain(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "application:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// run must stop every goroutine it starts.
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

	// The application placed the first orders, and was killed with the
	// last one on the wire: it never reported an order for it.
	assert.Regexp(t, `app \| → order ord_1\n`, text)
	assert.Regexp(t, `app \| → order ord_2\n`, text)
	assert.NotRegexp(t, `app \| → order ord_3`, text)
	sent := regexp.MustCompile(`app \|    key ([0-9a-f]{8})… checkout/cart-3: new → in_flight\n`).FindStringSubmatch(text)
	require.NotNil(t, sent, "the application sent checkout/cart-3")
	assert.Regexp(t, `The process ended: signal: killed\.`, text)

	// After the restart the journal says in_flight, never succeeded.
	journaled := regexp.MustCompile(`checkout/cart-3  key ([0-9a-f-]{36})  in_flight, leased by \S+`).FindStringSubmatch(text)
	require.NotNil(t, journaled, "the journal holds checkout/cart-3 in_flight, leased by the dead process")
	assert.Equal(t, sent[1], journaled[1][:8], "the same key before and after the crash")
	assert.Regexp(t, `checkout/cart-1  key [0-9a-f-]{36}  succeeded \(order ord_1\)`, text)
	assert.Regexp(t, `checkout/cart-2  key [0-9a-f-]{36}  succeeded \(order ord_2\)`, text)

	// Resume finished it from the status endpoint with the same key.
	assert.Regexp(t, `\n   key `+sent[1]+`… checkout/cart-3: in_flight → succeeded \(HTTP 201\)\n`, text)
	assert.Contains(t, text, "Resume: claimed 1, succeeded 1, rejected 0, still pending 0, still unknown 0, expired 0, failed 0")
	assert.Contains(t, text, "The restart sent 0 POST /orders and 1 status request(s).")
	assert.Contains(t, text, "3 logical operations, 3 orders on the server.")
}
