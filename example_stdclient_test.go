package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/idemkit/idem"
)

// StandardClient gives code that takes an *http.Client (a vendor SDK, a
// generated client) idem's promise: a request whose context names an
// operation is journaled with its key before it is sent, retried and
// settled like Do's, and answered again from the journal when the same
// operation is sent twice. Its credentials go with this call only and are
// never journaled; Config.Authorize supplies them after a restart.
func ExampleClient_StandardClient() {
	orders, created := ordersAPI()
	defer orders.Close()
	j, cleanup := tempJournal()
	defer cleanup()
	c, err := idem.New(idem.Config{
		Journal: j,
		BaseURL: orders.URL,
		Status:  idem.StatusEndpoint(orders.URL + "/idempotency"),
	})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	httpClient := c.StandardClient() // hand this to the SDK

	// What the SDK does, given a context that names the operation.
	ctx := idem.WithOperation(context.Background(), "checkout/cart-42")
	for range 2 {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, orders.URL+"/orders",
			strings.NewReader(`{"item":"book","quantity":1}`))
		if err != nil {
			panic(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer sk_test_123") // never journaled
		resp, err := httpClient.Do(req)
		if err != nil {
			panic(err) // errors.Is(err, idem.ErrOutcomeUnknown), …
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		res, _ := idem.ResultOf(resp)
		fmt.Println(resp.StatusCode, string(body), "from the journal:", res.Journaled)
	}
	fmt.Println("orders created:", created.Load())
	// Output:
	// 201 {"order_id":"ord_1"} from the journal: false
	// 201 {"order_id":"ord_1"} from the journal: true
	// orders created: 1
}

// RoundTripper is the same as a transport, for code that builds its own
// *http.Client. With RefuseUnnamedWrites, a write whose context names no
// operation is refused before anything is sent, so that none escapes the
// journal.
func ExampleClient_RoundTripper() {
	orders, created := ordersAPI()
	defer orders.Close()
	j, cleanup := tempJournal()
	defer cleanup()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: orders.URL})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	httpClient := &http.Client{Transport: c.RoundTripper(idem.RefuseUnnamedWrites()), Timeout: time.Minute}

	order := func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, orders.URL+"/orders",
			strings.NewReader(`{"item":"pen","quantity":3}`))
		if err != nil {
			return err
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		fmt.Println(resp.Status)
		return nil
	}
	err = order(context.Background())
	fmt.Println("without an operation:", errors.Is(err, idem.ErrInvalidOp))
	err = order(idem.WithScopedOperation(context.Background(), "acme", "checkout/cart-7"))
	fmt.Println("with one:", err, "orders created:", created.Load())
	// Output:
	// without an operation: true
	// 201 Created
	// with one: <nil> orders created: 1
}
