package testserver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/testserver"
	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/server"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const order = `{"item":"book","quantity":1}`

// fresh returns a client that opens a new connection for every request, so
// that net/http's transport never silently re-sends a request on a reused
// connection that died (see TestTransportResendsOnAReusedConnection).
func fresh(s *testserver.Server) *http.Client {
	tr := s.Client().Transport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true
	c := &http.Client{Transport: tr}
	return c
}

type reply struct {
	status  int
	header  http.Header
	body    string
	readErr error
}

func post(ctx context.Context, c *http.Client, s *testserver.Server, key, body string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/orders", strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b), readErr: err}, nil
}

func mustPost(t *testing.T, c *http.Client, s *testserver.Server, key string) reply {
	t.Helper()
	r, err := post(context.Background(), c, s, key, order)
	require.NoError(t, err)
	require.NoError(t, r.readErr)
	return r
}

func status(t *testing.T, c *http.Client, s *testserver.Server, key string) (int, string, error) {
	t.Helper()
	resp, err := c.Get(s.StatusURL + "/" + key)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), nil
}

func statusState(t *testing.T, c *http.Client, s *testserver.Server, key string) string {
	t.Helper()
	code, body, err := status(t, c, s, key)
	require.NoError(t, err)
	st, _, err := wire.DecodeStatus(code, []byte(body), key)
	require.NoError(t, err)
	return st.State
}

func TestNoFaultCreatesAndReplays(t *testing.T) {
	t.Parallel()
	s := testserver.Start(t)
	c := fresh(s)
	first := mustPost(t, c, s, "k1")
	assert.Equal(t, http.StatusCreated, first.status)
	assert.Contains(t, first.body, `"order_id":"ord_1"`)
	second := mustPost(t, c, s, "k1")
	assert.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
	assert.Equal(t, first.body, second.body)
	assert.Equal(t, 1, s.TotalOrders())
	assert.Equal(t, 1, s.Orders(""))
	assert.Equal(t, 2, s.Requests())
	assert.Equal(t, []string{"k1", "k1"}, s.KeysSeen())
	assert.Equal(t, wire.StateCompleted, statusState(t, c, s, "k1"))
	assert.Equal(t, 1, s.StatusRequests())
	assert.Equal(t, 1, s.Executions())
}

func TestDropBeforeHandler(t *testing.T) {
	t.Parallel()
	s := testserver.Start(t)
	c := fresh(s)
	s.Inject(testserver.DropBeforeHandler)
	_, err := post(context.Background(), c, s, "k", order)
	require.Error(t, err, "the connection closes with no response")
	assert.Equal(t, 0, s.TotalOrders())
	assert.Equal(t, 0, s.Executions())
	assert.Equal(t, wire.StateNotFound, statusState(t, c, s, "k"), "nothing stored")
	r := mustPost(t, c, s, "k")
	assert.Equal(t, http.StatusCreated, r.status)
	assert.Empty(t, r.header.Get("Idempotent-Replayed"), "the retry is the first execution")
	assert.Equal(t, 2, s.Requests())
	assert.Equal(t, 1, s.TotalOrders())
}

func TestDropAfterCommit(t *testing.T) {
	t.Parallel()
	s := testserver.Start(t)
	c := fresh(s)
	s.Inject(testserver.DropAfterCommit)
	_, err := post(context.Background(), c, s, "k", order)
	require.Error(t, err, "the connection closes with no response")
	assert.Equal(t, 1, s.TotalOrders(), "the order was created")
	assert.Equal(t, wire.StateCompleted, statusState(t, c, s, "k"), "and its response stored")
	r := mustPost(t, c, s, "k")
	assert.Equal(t, http.StatusCreated, r.status)
	assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	assert.Equal(t, 1, s.TotalOrders())
	assert.Equal(t, 1, s.Executions())
}

func TestHoldPastTimeout(t *testing.T) {
	t.Parallel()
	s := testserver.Start(t)
	c := fresh(s)
	s.Inject(testserver.HoldPastTimeout)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := post(ctx, c, s, "k", order)
		errc <- err
	}()
	// The order is created and stored while the answer is held. The
	// order exists before its response is stored (the middleware stores
	// it once the handler returns): wait for the status to say so.
	require.Eventually(t, func() bool { return s.TotalOrders() == 1 }, 10*time.Second, 5*time.Millisecond)
	state := statusState(t, c, s, "k")
	for deadline := time.Now().Add(10 * time.Second); state != wire.StateCompleted && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		state = statusState(t, c, s, "k")
	}
	require.Equal(t, wire.StateCompleted, state, "the response is stored while the answer is held")
	select {
	case err := <-errc:
		t.Fatalf("the answer must be held until the client gives up, got %v", err)
	default:
	}
	cancel() // the client's timeout
	require.ErrorIs(t, <-errc, context.Canceled)
	r := mustPost(t, c, s, "k")
	assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	assert.Equal(t, 1, s.TotalOrders())
}

func TestAnswersBeforeCommit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		fault      testserver.Fault
		status     int
		retryAfter string
	}{
		{testserver.ServerErrorBeforeCommit, http.StatusInternalServerError, ""},
		{testserver.UnavailableBeforeCommit, http.StatusServiceUnavailable, "1"},
		{testserver.TooManyRequests, http.StatusTooManyRequests, "1"},
	} {
		t.Run(tc.fault.String(), func(t *testing.T) {
			t.Parallel()
			s := testserver.Start(t)
			c := fresh(s)
			s.Inject(tc.fault)
			r := mustPost(t, c, s, "k")
			assert.Equal(t, tc.status, r.status)
			assert.Equal(t, tc.retryAfter, r.header.Get("Retry-After"))
			assert.Equal(t, 0, s.Executions(), "nothing executed")
			assert.Equal(t, wire.StateNotFound, statusState(t, c, s, "k"))
			r = mustPost(t, c, s, "k")
			assert.Equal(t, http.StatusCreated, r.status)
			assert.Empty(t, r.header.Get("Idempotent-Replayed"))
			assert.Equal(t, 1, s.TotalOrders())
		})
	}
}

func TestServerErrorAfterCommit(t *testing.T) {
	t.Parallel()
	s := testserver.Start(t)
	c := fresh(s)
	s.Inject(testserver.ServerErrorAfterCommit)
	r := mustPost(t, c, s, "k")
	assert.Equal(t, http.StatusInternalServerError, r.status)
	assert.Equal(t, 1, s.TotalOrders(), "the order was created before the 500")
	r = mustPost(t, c, s, "k")
	assert.Equal(t, http.StatusCreated, r.status)
	assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	assert.Equal(t, 1, s.Executions())
}

func TestResetMidBody(t *testing.T) {
	t.Parallel()
	s := testserver.Start(t)
	c := fresh(s)
	s.Inject(testserver.ResetMidBody)
	r, err := post(context.Background(), c, s, "k", order)
	require.NoError(t, err, "the status line and headers arrive")
	assert.Equal(t, http.StatusCreated, r.status)
	require.Error(t, r.readErr, "the body is cut short")
	assert.True(t, errors.Is(r.readErr, syscall.ECONNRESET) || errors.Is(r.readErr, io.ErrUnexpectedEOF), "got %v", r.readErr)
	assert.NotEmpty(t, r.body, "half the body arrives")
	assert.True(t, strings.HasPrefix(`{"order_id":"ord_1","item":"book","quantity":1}`, r.body), "got %q", r.body)
	assert.Equal(t, 1, s.TotalOrders())
	again := mustPost(t, c, s, "k")
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	assert.True(t, strings.HasPrefix(again.body, r.body))
}

func TestSlowHandlerMakesConcurrentAttemptsConflict(t *testing.T) {
	t.Parallel()
	s := testserver.Start(t)
	c := fresh(s)
	s.Inject(testserver.SlowHandler(time.Hour))
	done := make(chan reply, 1)
	go func() {
		r, err := post(context.Background(), c, s, "k", order)
		assert.NoError(t, err)
		done <- r
	}()
	require.Eventually(t, func() bool { return statusState(t, c, s, "k") == wire.StateProcessing }, 10*time.Second, 5*time.Millisecond)
	r := mustPost(t, c, s, "k")
	assert.Equal(t, http.StatusConflict, r.status)
	assert.Equal(t, 0, s.TotalOrders(), "the slow handler has not created the order yet")
	s.Close() // lets the held handler go on
	assert.Equal(t, http.StatusCreated, (<-done).status)
}

func TestSlowHandlerFinishes(t *testing.T) {
	t.Parallel()
	s := testserver.Start(t)
	c := fresh(s)
	s.Inject(testserver.SlowHandler(time.Millisecond))
	assert.Equal(t, http.StatusCreated, mustPost(t, c, s, "k").status)
	assert.Equal(t, 1, s.TotalOrders())
}

func TestStatusFaults(t *testing.T) {
	t.Parallel()
	s := testserver.Start(t)
	c := fresh(s)
	mustPost(t, c, s, "k")

	s.InjectStatus(testserver.StatusDown)
	code, _, err := status(t, c, s, "k")
	require.NoError(t, err)
	assert.Equal(t, http.StatusInternalServerError, code)

	s.InjectStatus(testserver.StatusGarbage)
	code, body, err := status(t, c, s, "k")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	_, _, err = wire.DecodeStatus(code, []byte(body), "k")
	assert.ErrorIs(t, err, wire.ErrBadStatus, "the body is not JSON")

	s.InjectStatus(testserver.StatusHang)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.StatusURL+"/k", nil)
	_, err = c.Do(req)
	require.ErrorIs(t, err, context.DeadlineExceeded, "no answer until the client gives up")

	assert.Equal(t, wire.StateCompleted, statusState(t, c, s, "k"), "the queue is empty again")
	assert.Equal(t, 4, s.StatusRequests())
}

func TestFaultsApplyInOrderPerRequest(t *testing.T) {
	t.Parallel()
	s := testserver.Start(t)
	c := fresh(s)
	s.InjectN(testserver.UnavailableBeforeCommit, 2)
	s.Inject(testserver.TooManyRequests)
	pending, _ := s.PendingFaults()
	assert.Equal(t, 3, pending)
	var got []int
	for range 4 {
		got = append(got, mustPost(t, c, s, "k").status)
	}
	assert.Equal(t, []int{503, 503, 429, 201}, got)
	pending, _ = s.PendingFaults()
	assert.Zero(t, pending)
	assert.Equal(t, []string{"k", "k", "k", "k"}, s.KeysSeen())
}

func TestKeysSeenRecordsTheValueAsSent(t *testing.T) {
	t.Parallel()
	s := testserver.Start(t)
	c := fresh(s)
	mustPost(t, c, s, `"quoted"`)
	mustPost(t, c, s, "quoted")
	assert.Equal(t, []string{`"quoted"`, "quoted"}, s.KeysSeen())
	assert.Equal(t, 1, s.TotalOrders(), "both forms are one key")
}

func TestTenantsAndGuard(t *testing.T) {
	t.Parallel()
	s := testserver.Start(t)
	c := fresh(s)
	for _, tenant := range []string{"a", "b", "b"} {
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/orders", strings.NewReader(order))
		req.Header.Set("Idempotency-Key", "k-"+tenant)
		req.Header.Set("X-Tenant", tenant)
		resp, err := c.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
	}
	assert.Equal(t, 1, s.Orders("a"))
	assert.Equal(t, 1, s.Orders("b"))
	assert.Equal(t, 0, s.Orders(""))
	assert.Equal(t, 2, s.TotalOrders())
	assert.Zero(t, s.GuardedDuplicates())
}

func TestSQLiteStoreOption(t *testing.T) {
	t.Parallel()
	s := testserver.Start(t, testserver.WithSQLiteStore(), testserver.WithLockTimeout(time.Minute))
	c := fresh(s)
	mustPost(t, c, s, "k")
	assert.Equal(t, "true", mustPost(t, c, s, "k").header.Get("Idempotent-Replayed"))
}

// TestTransportResendsOnAReusedConnection pins the net/http behaviour
// DESIGN.md warns about: a request with an Idempotency-Key on a reused
// keep-alive connection that dies before any reply is re-sent by the
// transport itself, unseen by the caller. The server sees two requests with
// the same key; the caller sees one answer.
func TestTransportResendsOnAReusedConnection(t *testing.T) {
	t.Parallel()
	s := testserver.Start(t)
	c := s.Client() // keep-alive
	mustPost(t, c, s, "warm-up")
	s.Inject(testserver.DropBeforeHandler)
	r := mustPost(t, c, s, "k")
	assert.Equal(t, http.StatusCreated, r.status, "the transport re-sent the dropped request on a new connection")
	assert.Equal(t, 3, s.Requests())
	assert.Equal(t, []string{"warm-up", "k", "k"}, s.KeysSeen())
	assert.Equal(t, 2, s.TotalOrders())
}

func TestCloseEndsHeldRequests(t *testing.T) {
	t.Parallel()
	s := testserver.Start(t)
	c := fresh(s)
	s.Inject(testserver.HoldPastTimeout)
	s.InjectStatus(testserver.StatusHang)
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := post(context.Background(), c, s, "k", order)
		assert.Error(t, err)
	})
	wg.Go(func() {
		_, _, err := status(t, c, s, "k")
		assert.Error(t, err)
	})
	require.Eventually(t, func() bool { return s.Requests() == 1 && s.StatusRequests() == 1 }, 10*time.Second, 5*time.Millisecond)
	s.Close()
	wg.Wait()
	_, err := post(context.Background(), c, s, "k2", order)
	assert.Error(t, err, "a closed server refuses connections")
}

// The wrapper sees every request, the middleware runs with the wrapper's
// request context, and OnOutcome gets it: as an application's HTTP
// instrumentation and the otel module's server hooks would.
func TestWrapAndOnOutcome(t *testing.T) {
	type mark struct{}
	var mu sync.Mutex
	var paths []string
	var outcomes []string
	s := testserver.Start(t,
		testserver.WithWrap(func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				paths = append(paths, r.Method+" "+r.URL.Path)
				mu.Unlock()
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), mark{}, "wrapped")))
			})
		}),
		testserver.WithOnOutcome(func(ctx context.Context, o server.Outcome) {
			mu.Lock()
			defer mu.Unlock()
			outcomes = append(outcomes, fmt.Sprintf("%v %d %v", o.Kind, o.Status, ctx.Value(mark{})))
		}))
	c := fresh(s)
	mustPost(t, c, s, "k1")
	mustPost(t, c, s, "k1")
	resp, err := c.Get(s.StatusURL + "/k1")
	require.NoError(t, err)
	_ = resp.Body.Close()

	// OnOutcome runs once the answer is written, which the client may read
	// first: wait for it.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(outcomes) == 2
	}, 5*time.Second, time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"POST /orders", "POST /orders", "GET /idempotency/k1"}, paths)
	assert.Equal(t, []string{"ran 201 wrapped", "replayed 201 wrapped"}, outcomes, "with the wrapper's request context")
}
