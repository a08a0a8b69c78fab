package journal_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/journal"
)

// A journal's write: read the stored record (inside the write transaction),
// call the rule, store what it returns and append its event. A stale writer
// is refused by the same rule, and nothing changes.
func ExampleApplyUpdate() {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	stored, created, err := journal.NewRecord(journal.Record{
		Key: "0190d1a2-7c3e-7f00-8000-000000000042", Scope: "tenant-a", ID: "checkout/cart-42",
		Method: "POST", URL: "https://api.example.com/orders", Fingerprint: "9f86d081884c7d65",
		KeyHeader: "Idempotency-Key", State: journal.StateInFlight, Attempts: 1,
	}, now, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(created.Kind, created.To, "version", stored.Version)

	next := journal.CloneRecord(stored)
	next.State = journal.StateSucceeded
	next.Response = &journal.Response{StatusCode: 201}
	answered, ev, err := journal.ApplyUpdate(stored, next, now.Add(40*time.Millisecond),
		journal.Event{Kind: journal.EventAnswer}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(ev.Kind, ev.From, "->", ev.To, ev.StatusCode, "version", answered.Version)

	// A writer that read version 1 comes too late.
	stale := journal.CloneRecord(stored)
	stale.State = journal.StateUnknown
	_, _, err = journal.ApplyUpdate(answered, stale, now.Add(time.Second), journal.Event{}, nil)
	fmt.Println(errors.Is(err, journal.ErrConflict))
	// Output:
	// create in_flight version 1
	// answer in_flight -> succeeded 201 version 2
	// true
}
