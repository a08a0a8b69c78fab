package idem

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/internal/benchcpu"
)

// BenchmarkMemoryJournalClientWrites measures what a Do that goes right
// asks of a MemoryJournal, without the HTTP around it: the client's create
// (createShared, in_flight with its lease, the client's own header) and
// its settle (updateShared, a 201 with BenchmarkSpeed's answer), on a
// journal that keeps every record, as BenchmarkSpeed's memory
// configuration does. cpu-ns/op is the process's CPU (the collector's
// included) per operation: a steadier measure of the journal's side of a
// Do than the whole call's, whose HTTP is most of its CPU and of its
// noise, and than ns/op on a machine others share.
func BenchmarkMemoryJournalClientWrites(b *testing.B) {
	ctx := context.Background()
	m := NewMemoryJournal()
	owner := "bench/1#12345678"
	body := make([]byte, 1024)
	respBody := []byte(`{"order_id":"ord_123","status":"created"}`)
	keys, ids := make([]string, b.N), make([]string, b.N)
	for i := range keys {
		keys[i], ids[i] = uuid.NewString(), fmt.Sprint("checkout/cart-", i)
	}
	b.ReportAllocs()
	cpu0, _ := benchcpu.Process()
	b.ResetTimer()
	for i := range b.N {
		now := time.Now()
		rec := Record{Key: keys[i], Scope: "default", ID: ids[i], Method: http.MethodPost,
			URL: "http://127.0.0.1:40000/orders", Header: http.Header{"Content-Type": {"application/json"}},
			Body: body, Fingerprint: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			KeyHeader: "Idempotency-Key", State: StateInFlight, Attempts: 1, ExpiresAt: now.Add(24 * time.Hour),
			Lease: Lease{Owner: owner, ExpiresAt: now.Add(15 * time.Second)}}
		stored, created, err := m.createShared(ctx, rec, true, false)
		if err != nil || !created {
			b.Fatal(err, created)
		}
		next := stored
		next.State = StateSucceeded
		next.Lease.ExpiresAt = time.Now().Add(15 * time.Second)
		next.Response = &Response{StatusCode: http.StatusCreated, Body: respBody, Header: http.Header{
			"Content-Type": {"application/json"}, "Content-Length": {"41"}, "Date": {"Wed, 02 Dec 2026 12:00:00 GMT"}}}
		if _, err := m.updateShared(ctx, next, Deferred, Event{Kind: EventAnswer}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if cpu1, ok := benchcpu.Process(); ok {
		b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
	}
}
