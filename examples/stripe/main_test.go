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
		"invoice-7 paid: pi_1, 2000 eur (Idempotent-Replayed: true)",
		"app | paying invoice-8",
		"The process ended: signal: killed.",
		"the journal: pay/invoice-8 is in_flight",
		"stripe-go's headers with no credential",
		"Resume: claimed 1, succeeded 1, unknown 0",
		"invoice-8 paid: pi_2, 3000 eur (0 request(s) sent for it now: the journal answered)",
		"2 payments, 2 PaymentIntents; Stripe saw 4 POSTs carrying 2 distinct keys.",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	if strings.Contains(text, "app | paid") {
		t.Error("the killed application reported a payment")
	}
}
