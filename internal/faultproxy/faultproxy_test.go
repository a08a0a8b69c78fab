package faultproxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Close must stop every goroutine the proxy started.
	goleak.VerifyTestMain(m)
}

// upstream is an httptest server that counts what reaches it.
type upstream struct {
	*httptest.Server

	mu       sync.Mutex
	orders   int // POST /orders
	status   int // GET /idempotency/{key}
	other    int
	lastReq  *http.Request
	lastBody []byte
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.orders++
		n := u.orders
		u.lastReq, u.lastBody = r, body
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Upstream", "orders")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order_id":"ord_%d","item":"a book with a long enough title"}`, n)
	})
	mux.HandleFunc("GET /idempotency/{key}", func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.status++
		u.lastReq = r
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"key":%q,"state":"processing"}`, r.PathValue("key"))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.other++
		u.lastReq, u.lastBody = r, body
		u.mu.Unlock()
		w.Header().Set("X-Echo-Path", r.URL.Path)
		w.Header().Set("Connection", "X-Hop")
		w.Header().Set("X-Hop", "must not pass")
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write(body)
	})
	u.Server = httptest.NewServer(mux)
	t.Cleanup(u.Close)
	return u
}

// reached returns how many orders, status and other requests reached the
// upstream.
func (u *upstream) reached() (orders, status, other int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.orders, u.status, u.other
}

func stats(p *Proxy, up *upstream) string {
	orders, status, other := up.reached()
	return fmt.Sprintf("%v; upstream: orders %d, status %d, other %d", p.Stats(), orders, status, other)
}

func startProxy(t *testing.T, up string, cfg Config) *Proxy {
	t.Helper()
	p, err := New(up, cfg)
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

// plainClient is a net/http client that opens a connection per request, so
// that net/http never re-sends a request on its own.
func plainClient(t *testing.T, timeout time.Duration) *http.Client {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: timeout}
}

func postOrder(c *http.Client, base string) (*http.Response, []byte, error) {
	req, err := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(`{"item":"book","quantity":1}`))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "9f1c2a4e-4c1b-4f59-9a7e-3b1a2c3d4e5f")
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

func getStatus(c *http.Client, base string) (*http.Response, []byte, error) {
	resp, err := c.Get(base + "/idempotency/9f1c2a4e-4c1b-4f59-9a7e-3b1a2c3d4e5f")
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

func only(f Fault) Config {
	if f.Status() {
		return Config{StatusRates: map[Fault]float64{f: 1}}
	}
	return Config{Rates: map[Fault]float64{f: 1}}
}

// rawExchange writes a POST /orders with a 1000-byte body on a fresh TCP
// connection and reads until the connection ends.
func rawExchange(t *testing.T, proxyURL string) ([]byte, error) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(proxyURL, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	body := strings.Repeat("x", 1000)
	_, err = fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: proxy\r\nIdempotency-Key: k1\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(t, err)
	return io.ReadAll(conn)
}

func TestPassForwardsUntouched(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	p := startProxy(t, up.URL+"/base/", Config{})
	req, err := http.NewRequest(http.MethodPut, p.URL+"/a/b%2Fc?x=1&y=2", strings.NewReader("payload"))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "k-1")
	req.Header.Set("Connection", "X-Drop")
	req.Header.Set("X-Drop", "hop-by-hop")
	resp, err := plainClient(t, 5*time.Second).Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()

	assert.Equal(t, http.StatusAccepted, resp.StatusCode)
	assert.Equal(t, "payload", string(body))
	assert.Equal(t, "7", resp.Header.Get("Content-Length"))
	assert.Empty(t, resp.Header.Get("X-Hop"), "hop-by-hop headers named in Connection are dropped")
	assert.Empty(t, resp.Header.Get(InjectedHeader))

	up.mu.Lock()
	r, got := up.lastReq, up.lastBody
	up.mu.Unlock()
	require.NotNil(t, r)
	assert.Equal(t, http.MethodPut, r.Method)
	assert.Equal(t, "/base/a/b%2Fc", r.URL.EscapedPath(), "the upstream's path prefixes the request's, escapes kept")
	assert.Equal(t, "x=1&y=2", r.URL.RawQuery)
	assert.Equal(t, "k-1", r.Header.Get("Idempotency-Key"))
	assert.Empty(t, r.Header.Get("X-Drop"))
	assert.Equal(t, "payload", string(got))

	s := p.Stats()
	assert.Equal(t, 1, s.Requests)
	assert.Equal(t, 1, s.Forwarded)
	assert.Equal(t, 1, s.Faults[Pass])
	assert.Zero(t, s.Injected())
}

func TestDropResponseCommitsUpstreamAndClosesTheConnection(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	p := startProxy(t, up.URL, only(DropResponse))

	_, _, err := postOrder(plainClient(t, 5*time.Second), p.URL)
	require.Error(t, err)
	assert.ErrorIs(t, err, io.EOF, "the connection was closed without an answer")
	orders, _, _ := up.reached()
	assert.Equal(t, 1, orders, "the upstream answered in full first")

	data, err := rawExchange(t, p.URL)
	require.NoError(t, err, "a FIN, not a reset")
	assert.Empty(t, data, "not a byte of the answer")
	orders, _, _ = up.reached()
	assert.Equal(t, 2, orders)
	assert.Equal(t, 2, p.Counts()[DropResponse])
	assert.Equal(t, 2, p.Stats().Forwarded)
}

func TestResetRequestNeverReachesUpstream(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	p := startProxy(t, up.URL, only(ResetRequest))

	_, _, err := postOrder(plainClient(t, 5*time.Second), p.URL)
	require.Error(t, err)
	data, err := rawExchange(t, p.URL)
	assert.Empty(t, data)
	assert.ErrorIs(t, err, syscall.ECONNRESET, "a TCP RST")

	orders, status, other := up.reached()
	assert.Zero(t, orders+status+other, "nothing reaches the upstream")
	assert.Equal(t, 2, p.Counts()[ResetRequest])
	assert.Zero(t, p.Stats().Forwarded)
}

func TestResetResponseCutsTheBody(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	p := startProxy(t, up.URL, only(ResetResponse))

	resp, body, err := postOrder(plainClient(t, 5*time.Second), p.URL)
	require.Error(t, err, "the client sees the answer cut off")
	if resp != nil {
		assert.Equal(t, http.StatusCreated, resp.StatusCode, "the upstream's status line")
		assert.Less(t, len(body), int(resp.ContentLength))
	}

	data, err := rawExchange(t, p.URL)
	assert.ErrorIs(t, err, syscall.ECONNRESET, "a TCP RST")
	head, part, found := strings.Cut(string(data), "\r\n\r\n")
	require.True(t, found, "the status line and every header arrive: %q", data)
	assert.True(t, strings.HasPrefix(head, "HTTP/1.1 201 Created\r\n"), head)
	assert.Contains(t, head, "X-Upstream: orders")
	i := strings.Index(head, "Content-Length: ")
	require.GreaterOrEqual(t, i, 0, head)
	n, err := strconv.Atoi(strings.Fields(head[i+len("Content-Length: "):])[0])
	require.NoError(t, err)
	assert.NotEmpty(t, part, "part of the body arrives")
	assert.Less(t, len(part), n, "not all of it")
	assert.True(t, strings.HasPrefix(part, `{"order_id":"ord_2"`), "the first half of the upstream's body: %q", part)

	orders, _, _ := up.reached()
	assert.Equal(t, 2, orders, "the upstream answered")
	assert.Equal(t, 2, p.Counts()[ResetResponse])
}

func TestDelayHoldsUntilTheClientGivesUp(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	p := startProxy(t, up.URL, Config{Rates: map[Fault]float64{Delay: 1}, Delay: time.Minute})

	start := time.Now()
	_, _, err := postOrder(plainClient(t, 200*time.Millisecond), p.URL)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout(), "the client's timeout ends it: %v", err)
	assert.Less(t, time.Since(start), 5*time.Second)
	orders, _, _ := up.reached()
	assert.Equal(t, 1, orders, "the upstream answered before the hold")
	assert.Equal(t, 1, p.Counts()[Delay])
}

func TestDelayDropsAfterConfigDelay(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	p := startProxy(t, up.URL, Config{Rates: map[Fault]float64{Delay: 1}, Delay: 150 * time.Millisecond})

	start := time.Now()
	_, _, err := postOrder(plainClient(t, time.Minute), p.URL)
	elapsed := time.Since(start)
	assert.ErrorIs(t, err, io.EOF, "held, then dropped")
	assert.GreaterOrEqual(t, elapsed, 150*time.Millisecond)
	assert.Less(t, elapsed, 10*time.Second)
	orders, _, _ := up.reached()
	assert.Equal(t, 1, orders)
}

func TestLateForwardArrivesAfterTheClientGaveUp(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	p := startProxy(t, up.URL, Config{Rates: map[Fault]float64{LateForward: 1}, Delay: 400 * time.Millisecond})

	start := time.Now()
	_, _, err := postOrder(plainClient(t, 100*time.Millisecond), p.URL)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout(), "%v", err)
	orders, _, _ := up.reached()
	assert.Zero(t, orders, "nothing has reached the upstream when the client gives up")
	require.Eventually(t, func() bool { o, _, _ := up.reached(); return o == 1 }, 10*time.Second, 5*time.Millisecond,
		"the request reaches the upstream late")
	assert.GreaterOrEqual(t, time.Since(start), 400*time.Millisecond)
	assert.Equal(t, 1, p.Counts()[LateForward])
	assert.Equal(t, 1, p.Stats().Forwarded)
}

func TestAnswersNeverReachUpstream(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		fault      Fault
		code       int
		retryAfter string
	}{
		{Answer5xx, http.StatusInternalServerError, ""},
		{Answer429, http.StatusTooManyRequests, "1"},
		{Answer503, http.StatusServiceUnavailable, "1"},
	} {
		t.Run(tc.fault.String(), func(t *testing.T) {
			t.Parallel()
			up := startUpstream(t)
			p := startProxy(t, up.URL, only(tc.fault))

			// A keep-alive client: the injected answer leaves the
			// connection usable, as a real one would.
			tr := &http.Transport{}
			t.Cleanup(tr.CloseIdleConnections)
			c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
			var reused []bool
			for range 2 {
				req, err := http.NewRequest(http.MethodPost, p.URL+"/orders", strings.NewReader(`{"item":"book"}`))
				require.NoError(t, err)
				req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
					GotConn: func(i httptrace.GotConnInfo) { reused = append(reused, i.Reused) },
				}))
				resp, err := c.Do(req)
				require.NoError(t, err)
				body, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				resp.Body.Close()
				assert.Equal(t, tc.code, resp.StatusCode)
				assert.Equal(t, tc.retryAfter, resp.Header.Get("Retry-After"))
				assert.Equal(t, tc.fault.String(), resp.Header.Get(InjectedHeader))
				assert.Contains(t, string(body), "injected")
			}
			assert.Equal(t, []bool{false, true}, reused, "the connection is kept")
			orders, status, other := up.reached()
			assert.Zero(t, orders+status+other, "nothing reaches the upstream")
			assert.Equal(t, 2, p.Counts()[tc.fault])
			assert.Zero(t, p.Stats().Forwarded)
		})
	}
}

func TestStatusFail(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	p := startProxy(t, up.URL, only(StatusFail))
	c := plainClient(t, 5*time.Second)

	resp, _, err := getStatus(c, p.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	assert.Equal(t, StatusFail.String(), resp.Header.Get(InjectedHeader))
	_, status, _ := up.reached()
	assert.Zero(t, status)

	// Status rates leave other requests alone.
	resp, _, err = postOrder(c, p.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	s := p.Stats()
	assert.Equal(t, 1, s.Requests)
	assert.Equal(t, 1, s.StatusRequests)
	assert.Equal(t, 1, s.Faults[StatusFail])
	assert.Equal(t, 1, s.Faults[Pass])
}

func TestStatusHangUntilTheClientGivesUp(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	p := startProxy(t, up.URL, only(StatusHang))

	start := time.Now()
	_, _, err := getStatus(plainClient(t, 200*time.Millisecond), p.URL)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout(), "%v", err)
	assert.Less(t, time.Since(start), 5*time.Second)
	_, status, _ := up.reached()
	assert.Zero(t, status, "the upstream is not asked")
	assert.Equal(t, 1, p.Counts()[StatusHang])
}

func TestRequestRatesLeaveStatusRequestsAlone(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	p := startProxy(t, up.URL, only(Answer429))
	resp, body, err := getStatus(plainClient(t, 5*time.Second), p.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(body), `"state":"processing"`)
	_, status, _ := up.reached()
	assert.Equal(t, 1, status)
	assert.Equal(t, 1, p.Counts()[Pass])
}

func TestScriptComesFirst(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	p := startProxy(t, up.URL, Config{
		Rates:        map[Fault]float64{Answer429: 1},
		Script:       []Fault{Answer503, Pass, DropResponse},
		StatusScript: []Fault{StatusFail, Pass},
	})
	c := plainClient(t, 5*time.Second)
	var got []string
	for range 4 {
		resp, _, err := postOrder(c, p.URL)
		if err != nil {
			got = append(got, "error")
			continue
		}
		got = append(got, strconv.Itoa(resp.StatusCode))
	}
	assert.Equal(t, []string{"503", "201", "error", "429"}, got)
	for _, want := range []int{500, 200, 200} {
		resp, _, err := getStatus(c, p.URL)
		require.NoError(t, err)
		assert.Equal(t, want, resp.StatusCode)
	}
}

func TestUpstreamDownIs502(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	p := startProxy(t, up.URL, Config{})
	up.Close()
	resp, _, err := postOrder(plainClient(t, 5*time.Second), p.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	assert.Equal(t, 1, p.Stats().UpstreamErrors)
}

func TestCloseLetsHeldRequestsGo(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	p, err := New(up.URL, Config{Rates: map[Fault]float64{Delay: 1}, StatusRates: map[Fault]float64{StatusHang: 1}})
	require.NoError(t, err)
	require.NoError(t, p.Start())
	c := plainClient(t, time.Minute)
	errs := make(chan error, 2)
	go func() { _, _, err := postOrder(c, p.URL); errs <- err }()
	go func() { _, _, err := getStatus(c, p.URL); errs <- err }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		s := p.Stats()
		orders, _, _ := up.reached()
		if s.Requests == 1 && s.StatusRequests == 1 && orders == 1 {
			break
		}
		select {
		case err := <-errs:
			t.Fatalf("a request ended before Close: %v; %s", err, stats(p, up))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the requests are not held: %s", stats(p, up))
		}
	}

	start := time.Now()
	require.NoError(t, p.Close())
	assert.Less(t, time.Since(start), 5*time.Second, "Close does not wait for the holds to end by themselves")
	for range 2 {
		select {
		case err := <-errs:
			assert.Error(t, err, "a held request fails when the proxy closes")
		case <-time.After(5 * time.Second):
			t.Fatal("a held request was not let go")
		}
	}
	require.NoError(t, p.Close(), "Close twice is fine")
	_, err = http.Get(p.URL + "/orders")
	assert.Error(t, err, "nothing listens after Close")
	assert.Error(t, p.Start(), "no restart")
}

func TestSameSeedSameFaults(t *testing.T) {
	t.Parallel()
	up := startUpstream(t)
	cfg := func(seed int64) Config {
		return Config{Seed: seed, Rates: map[Fault]float64{Answer5xx: 0.25, Answer429: 0.25, Answer503: 0.25}}
	}
	run := func(seed int64) []int {
		p := startProxy(t, up.URL, cfg(seed))
		c := plainClient(t, 5*time.Second)
		var codes []int
		for range 40 {
			resp, _, err := postOrder(c, p.URL)
			require.NoError(t, err)
			codes = append(codes, resp.StatusCode)
		}
		return codes
	}
	a, b, other := run(7), run(7), run(8)
	assert.Equal(t, a, b, "the same seed draws the same faults in the same order")
	assert.NotEqual(t, a, other)
}

func TestPickerFollowsTheRates(t *testing.T) {
	t.Parallel()
	rates := map[Fault]float64{DropResponse: 0.05, ResetRequest: 0.04, ResetResponse: 0.05, Delay: 0.04,
		Answer5xx: 0.04, Answer429: 0.04, Answer503: 0.04, LateForward: 0.02}
	p := newPicker(rates, RequestFaults(), nil, 42, 1)
	const n = 200_000
	got := map[Fault]int{}
	for range n {
		got[p.pick()]++
	}
	for f, r := range rates {
		assert.InDelta(t, r, float64(got[f])/n, 0.004, f.String())
	}
	assert.InDelta(t, 0.68, float64(got[Pass])/n, 0.006)
	for f := range got {
		assert.False(t, f.Status(), "a request picker never draws a status fault")
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		upstream string
		cfg      Config
		want     string
	}{
		"relative upstream":    {"/orders", Config{}, "absolute http URL"},
		"https upstream":       {"https://127.0.0.1:1", Config{}, "absolute http URL"},
		"query":                {"http://127.0.0.1:1/?a=b", Config{}, "query"},
		"negative rate":        {"http://127.0.0.1:1", Config{Rates: map[Fault]float64{Answer429: -0.1}}, "not a probability"},
		"rates over 1":         {"http://127.0.0.1:1", Config{Rates: map[Fault]float64{Answer429: 0.6, Answer503: 0.6}}, "more than 1"},
		"status fault in rate": {"http://127.0.0.1:1", Config{Rates: map[Fault]float64{StatusFail: 0.1}}, "other map"},
		"request fault in status": {"http://127.0.0.1:1", Config{StatusRates: map[Fault]float64{DropResponse: 0.1}},
			"other map"},
		"pass rate":         {"http://127.0.0.1:1", Config{Rates: map[Fault]float64{Pass: 0.1}}, "not a fault"},
		"script":            {"http://127.0.0.1:1", Config{Script: []Fault{StatusHang}}, "not a request fault"},
		"status script":     {"http://127.0.0.1:1", Config{StatusScript: []Fault{Answer429}}, "not a status fault"},
		"negative delay":    {"http://127.0.0.1:1", Config{Delay: -time.Second}, "negative"},
		"unknown fault":     {"http://127.0.0.1:1", Config{Rates: map[Fault]float64{Fault(200): 0.1}}, "not a fault"},
		"fault beyond list": {"http://127.0.0.1:1", Config{Rates: map[Fault]float64{numFaults: 0.1}}, "not a fault"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(tc.upstream, tc.cfg)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestStatsString(t *testing.T) {
	t.Parallel()
	s := Stats{Requests: 3, StatusRequests: 1, Forwarded: 2, Faults: map[Fault]int{Pass: 2, Answer429: 1, StatusFail: 1}}
	assert.Equal(t, 2, s.Injected())
	assert.Equal(t, "requests=3 status_requests=1 forwarded=2 upstream_errors=0 injected=2: Pass=2 DropResponse=0 "+
		"ResetRequest=0 ResetResponse=0 Delay=0 Answer5xx=0 Answer429=1 Answer503=0 LateForward=0 StatusFail=1 StatusHang=0", s.String())
	assert.Equal(t, "Fault(99)", Fault(99).String())
}

// A reset connection reads as ECONNRESET on the client, whatever the
// platform's wording: keep the raw checks honest.
func TestRawExchangeSeesReset(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = bufio.NewReader(conn).ReadString('\n')
		rst(conn)
	}()
	_, err = rawExchange(t, "http://"+ln.Addr().String())
	<-done
	assert.True(t, errors.Is(err, syscall.ECONNRESET), "%v", err)
}
