package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idem"
)

// clientFloor is the client's contract floor (issue #24): the cheapest
// journaled client one can write by hand on plain go-retryablehttp that
// still keeps what DESIGN.md asks of a journaled call, in memory, as
// postgres/journal_floor_bench_test.go's contractFloor is for the
// PostgreSQL journal. What it keeps:
//
//   - one record per operation ID, found by a map under a mutex;
//   - before the send, the intent: a new key (UUID v4), the method, the
//     URL, a copy of the header and of the body (the caller may reuse
//     them), their fingerprint (SHA-256 of method, URL and body, the
//     client's own Fingerprint) and the state in flight;
//   - the key sent in the Idempotency-Key header;
//   - after the answer, the response read whole (status, a copy of the
//     header, the body) stored as settled, and returned in copies the
//     caller may change without changing the record;
//   - a second call with the same ID and request returns the stored result
//     without sending; with another request, it is refused.
//
// It has none of the rest of idem's promises: no Close that interrupts
// calls, no AttemptTimeout, Authorize, hooks, redaction of secret
// headers, status checks, leases or history, and a call that fails is
// left in flight. What it costs beyond plain go-retryablehttp is what the
// contract's journaled call costs at the least.
type clientFloor struct {
	rc  *retryablehttp.Client
	mu  sync.Mutex
	ops map[string]*floorRecord
}

type floorState int

const (
	floorInFlight floorState = iota + 1
	floorSettled
)

// floorRecord is what clientFloor journals of an operation.
type floorRecord struct {
	key         string
	method      string
	url         string
	header      http.Header
	body        []byte
	fingerprint string
	state       floorState
	status      int
	respHeader  http.Header
	respBody    []byte
}

// floorResult is what a clientFloor call returns.
type floorResult struct {
	Key        string
	StatusCode int
	Header     http.Header
	Body       []byte
	Stored     bool // returned from the record, nothing sent
}

var (
	errFloorMismatch = errors.New("client floor: the operation was journaled with another request")
	errFloorInFlight = errors.New("client floor: the operation is in flight")
)

func newClientFloor(rc *retryablehttp.Client) *clientFloor {
	return &clientFloor{rc: rc, ops: make(map[string]*floorRecord)}
}

// do makes operation id's request, journaled.
func (f *clientFloor) do(ctx context.Context, id, method, url string, header http.Header, body []byte) (floorResult, error) {
	fp := idem.Fingerprint(method, url, nil, nil, body)
	f.mu.Lock()
	if r, ok := f.ops[id]; ok {
		defer f.mu.Unlock()
		switch {
		case r.fingerprint != fp:
			return floorResult{}, errFloorMismatch
		case r.state != floorSettled:
			return floorResult{}, errFloorInFlight
		}
		return floorResult{Key: r.key, StatusCode: r.status, Header: r.respHeader.Clone(),
			Body: bytes.Clone(r.respBody), Stored: true}, nil
	}
	key := uuid.NewString()
	r := &floorRecord{key: key, method: method, url: url, header: header.Clone(), body: bytes.Clone(body),
		fingerprint: fp, state: floorInFlight}
	f.ops[id] = r
	f.mu.Unlock()

	req, err := retryablehttp.NewRequestWithContext(ctx, method, url, r.body)
	if err != nil {
		return floorResult{}, err
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := f.rc.Do(req)
	if err != nil {
		return floorResult{}, err // left in flight: its outcome is unknown
	}
	b, err := io.ReadAll(resp.Body)
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return floorResult{}, err
	}
	stored := resp.Header.Clone()
	f.mu.Lock()
	r.status, r.respHeader, r.respBody, r.state = resp.StatusCode, stored, b, floorSettled
	f.mu.Unlock()
	return floorResult{Key: key, StatusCode: resp.StatusCode, Header: resp.Header, Body: bytes.Clone(b)}, nil
}

// record returns a copy of what f has journaled of operation id.
func (f *clientFloor) record(id string) (floorRecord, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.ops[id]
	if !ok {
		return floorRecord{}, false
	}
	return *r, true
}

// TestClientFloorKeepsTheContract shows that the floor BenchmarkSpeed
// measures is a journaled call: the intent journaled before the send, the
// key on the wire, the answer settled whole, the second call answered from
// the record, another request under the same ID refused, and the record
// out of the caller's reach.
func TestClientFloorKeepsTheContract(t *testing.T) {
	var f *clientFloor
	var sent atomic.Int32
	var mu sync.Mutex // seen is the handler's, read once the call returns
	var atSend floorRecord
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		mu.Lock()
		defer mu.Unlock()
		var seenOK bool
		atSend, seenOK = f.record("order-1")
		if got := r.Header.Get("Idempotency-Key"); !seenOK || got != atSend.key {
			t.Errorf("sent key %q; journaled before the send: %v, key %q", got, seenOK, atSend.key)
		}
		b, _ := io.ReadAll(r.Body)
		if !bytes.Equal(b, []byte(`{"n":1}`)) || r.Header.Get("X-Cart") != "42" {
			t.Errorf("sent body %q, X-Cart %q", b, r.Header.Get("X-Cart"))
		}
		w.Header().Set("Location", "/orders/9")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":9}`))
	}))
	defer srv.Close()
	f = newClientFloor(speedRetryClient())
	url := srv.URL + "/orders"
	ctx := context.Background()
	header := http.Header{"X-Cart": {"42"}}
	body := []byte(`{"n":1}`)

	res, err := f.do(ctx, "order-1", http.MethodPost, url, header, body)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	seen := atSend
	mu.Unlock()
	if seen.state != floorInFlight || seen.method != http.MethodPost || seen.url != url ||
		!bytes.Equal(seen.body, body) || seen.header.Get("X-Cart") != "42" ||
		seen.fingerprint != idem.Fingerprint(http.MethodPost, url, nil, nil, body) {
		t.Errorf("intent at the send: %+v", seen)
	}
	if res.StatusCode != http.StatusCreated || string(res.Body) != `{"id":9}` || res.Header.Get("Location") != "/orders/9" || res.Stored {
		t.Fatalf("first call: %+v", res)
	}
	// The caller's buffers and the result are the caller's to change.
	header.Set("X-Cart", "43")
	body[0] = '['
	res.Body[0] = '['
	res.Header.Set("Location", "elsewhere")
	rec, _ := f.record("order-1")
	if rec.state != floorSettled || rec.status != http.StatusCreated || string(rec.respBody) != `{"id":9}` ||
		rec.respHeader.Get("Location") != "/orders/9" || rec.body[0] != '{' || rec.header.Get("X-Cart") != "42" {
		t.Errorf("settled record: %+v", rec)
	}

	body[0] = '{'
	again, err := f.do(ctx, "order-1", http.MethodPost, url, http.Header{"X-Cart": {"42"}}, body)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Stored || again.Key != res.Key || again.StatusCode != http.StatusCreated || string(again.Body) != `{"id":9}` ||
		again.Header.Get("Location") != "/orders/9" {
		t.Errorf("second call: %+v", again)
	}
	if _, err := f.do(ctx, "order-1", http.MethodPost, url, nil, []byte(`{"n":2}`)); !errors.Is(err, errFloorMismatch) {
		t.Errorf("another request under the same ID: %v", err)
	}
	if n := sent.Load(); n != 1 {
		t.Errorf("%d requests sent, want 1", n)
	}
}

// speedFloor runs clientFloor calls for distinct operations from callers
// goroutines, as speedDo runs Do (IDs made before the timer).
func speedFloor(b *testing.B, callers int) {
	srv := benchServer(b)
	f := newClientFloor(speedRetryClient())
	url := srv.URL + "/orders"
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = fmt.Sprint("checkout/cart-", i)
	}
	b.ReportAllocs()
	runConcurrent(b, callers, func(i int64) error {
		return floorCall(f, url, ids[i-1])
	})
	b.ReportMetric(0, "fsyncs/op")
}

// floorCall is one benchmark call of the floor: the POST of speedBody,
// its answer checked as memory's is.
func floorCall(f *clientFloor, url, id string) error {
	res, err := f.do(context.Background(), id, http.MethodPost, url, speedHeader, speedBody)
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusCreated {
		return fmt.Errorf("status %d", res.StatusCode)
	}
	return nil
}
