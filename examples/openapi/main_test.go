package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
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
	os.Exit(m.Run())
}

func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, &out)
	text := out.String()
	t.Log("\n" + text)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"cart-1: order ord_1, 1 × book",
		"app | placing cart-2",
		"The process ended: signal: killed.",
		"the journal: checkout/cart-2 is in_flight",
		"Resume: claimed 1, succeeded 1, unknown 0",
		"cart-2: order ord_2, 2 × book (0 request(s) sent for it now: the journal answered)",
		"2 orders placed, 2 in the database; the API saw 2 POSTs carrying 2 distinct keys.",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	if strings.Contains(text, "app | placed") {
		t.Error("the killed application reported an order")
	}
}
