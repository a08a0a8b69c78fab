package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/idemkit/idem"
)

// When Config.Authorize fails, nothing is sent and no attempt is counted:
// the call stops at once, the operation stays pending, and the error
// carries Authorize's own error. The next Do sends it, with the same key.
func ExampleErrAuthorizeFailed() {
	a, created := ordersAPI()
	defer a.Close()
	j, done := tempJournal()
	defer done()
	errNoToken := errors.New("the token service is down")
	tokenServiceDown := true
	c, err := idem.New(idem.Config{Journal: j, BaseURL: a.URL, Authorize: func(r *http.Request) error {
		if tokenServiceDown {
			return errNoToken
		}
		r.Header.Set("Authorization", "Bearer t0ken")
		return nil
	}})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	ctx := context.Background()
	op := idem.Op{ID: "checkout/cart-42", Method: "POST", URL: "/orders", Body: []byte(`{"cart":42}`)}

	_, err = c.Do(ctx, op)
	fmt.Println(errors.Is(err, idem.ErrAuthorizeFailed), errors.Is(err, errNoToken), errors.Is(err, idem.ErrNotSent))
	fmt.Println("orders created:", created.Load())

	tokenServiceDown = false
	res, err := c.Do(ctx, op)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.StatusCode, "after", res.Attempts, "attempt")
	// Output:
	// true true true
	// orders created: 0
	// 201 after 1 attempt
}
