package probe_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/probe"
)

const orderBody = `{"item":"book","quantity":1}`

// runProbe probes a's POST /orders with cfg's other fields, and checks
// what every run must hold: the server saw exactly the requests the
// report counts, never more than the budget.
func runProbe(t *testing.T, a *api, cfg probe.Config) probe.Report {
	t.Helper()
	cfg.URL = a.url("/orders")
	if cfg.Body == nil {
		cfg.Body = []byte(orderBody)
	}
	var steps []probe.Step
	cfg.OnStep = func(s probe.Step) {
		steps = append(steps, s)
		a.onStep(s)
	}
	rep, err := probe.Run(context.Background(), cfg)
	require.NoError(t, err)
	max := cfg.MaxRequests
	if max == 0 {
		max = probe.DefaultMaxRequests
	}
	require.Equal(t, int64(rep.Requests), a.requests.Load(), "the report's count and the server's")
	require.LessOrEqual(t, rep.Requests, max)
	announced, inFindings := 0, 0
	for _, s := range steps {
		announced += s.Requests
	}
	for _, f := range rep.Findings {
		inFindings += f.Requests
		require.Len(t, f.Exchanges, f.Requests, "finding %s", f.Step)
	}
	require.Equal(t, rep.Requests, announced, "every request was announced: %+v", steps)
	require.Equal(t, rep.Requests, inFindings, "every request is in a finding")
	return rep
}

func finding(t *testing.T, rep probe.Report, step string) probe.Finding {
	t.Helper()
	f, ok := rep.Finding(step)
	require.True(t, ok, "no finding for %s in %+v", step, rep.Findings)
	return f
}

// outcomes maps each step to its outcome and grade, the last finding of a
// step winning.
func outcomes(rep probe.Report) map[string]string {
	m := map[string]string{}
	for _, f := range rep.Findings {
		m[f.Step] = f.Outcome + "/" + string(f.Grade)
	}
	return m
}

func TestTheServerPackageIsSafe(t *testing.T) {
	t.Parallel()
	a := idemAPI(t, "")
	rep := runProbe(t, a, probe.Config{StatusURL: a.url("/idempotency/{key}"), OtherURL: a.url("/refunds")})

	require.Equal(t, probe.Safe, rep.Verdict, "%+v", rep.Findings)
	require.True(t, rep.Complete)
	require.Equal(t, map[string]string{
		probe.StepReplay:        "replayed/ok",
		probe.StepMismatch:      "key-conflict/ok",
		probe.StepConcurrent:    "in-progress-409/ok",
		probe.StepOtherEndpoint: "same-entry-refused/ok",
		probe.StepStatus:        "idem-format/ok",
		probe.StepKeyForm:       "both/ok",
	}, outcomes(rep))

	replay := finding(t, rep, probe.StepReplay)
	require.Len(t, replay.Exchanges, 2)
	assert.Equal(t, replay.Exchanges[0].Key, replay.Exchanges[1].Key)
	assert.Equal(t, "Idempotent-Replayed", replay.Exchanges[1].ReplayHeader)
	assert.Equal(t, replay.Exchanges[0].BodySHA256, replay.Exchanges[1].BodySHA256)
	assert.Contains(t, replay.Summary, "marked Idempotent-Replayed: true, the same status (201), the same body")

	mismatch := finding(t, rep, probe.StepMismatch)
	assert.Equal(t, 422, mismatch.Exchanges[1].Status)
	assert.Equal(t, "urn:idem:problem:key-reused", mismatch.Exchanges[1].ProblemType)
	assert.Equal(t, "other body", mismatch.Exchanges[1].Body)

	conc := finding(t, rep, probe.StepConcurrent)
	statuses := []int{conc.Exchanges[0].Status, conc.Exchanges[1].Status}
	assert.ElementsMatch(t, []int{201, 409}, statuses)
	assert.Contains(t, conc.Summary, "with Retry-After: 1")

	status := finding(t, rep, probe.StepStatus)
	assert.Equal(t, []int{200, 404}, []int{status.Exchanges[0].Status, status.Exchanges[1].Status})
	assert.Equal(t, replay.Exchanges[0].Key, status.Exchanges[0].Key, "the status of the replay step's key")

	assert.Equal(t, probe.Advice{Status: fmt.Sprintf("idem.StatusEndpoint(%q)", a.url("/idempotency"))}, rep.Advice)
	// One order per key that ran: replay, mismatch, concurrent, other
	// endpoint, key form.
	assert.Equal(t, int64(5), a.orders.Load())
}

func TestAnAPIWithoutIdempotencyIsNotSafe(t *testing.T) {
	t.Parallel()
	a := plainAPI(t)
	rep := runProbe(t, a, probe.Config{StatusURL: a.url("/idempotency/{key}")})

	require.Equal(t, probe.NotSafe, rep.Verdict)
	var tried []string
	for _, f := range rep.Findings {
		if f.Step == probe.StepReplay {
			require.Equal(t, "executed-twice", f.Outcome, f.Summary)
			require.Equal(t, probe.GradeUnsafe, f.Grade)
			require.NotEqual(t, f.Exchanges[0].BodySHA256, f.Exchanges[1].BodySHA256)
			tried = append(tried, f.Exchanges[0].KeyHeader)
			continue
		}
		require.Equal(t, probe.GradeSkipped, f.Grade, "%s: %s", f.Step, f.Summary)
		require.Contains(t, f.Summary, "the key is not honoured")
	}
	require.Equal(t, []string{"Idempotency-Key", "X-Idempotency-Key"}, tried)
	// Two keys tried, two orders each; nothing more was sent.
	require.Equal(t, int64(4), a.orders.Load())
	require.Equal(t, "", rep.Advice.Status)
	require.Len(t, rep.Advice.Notes, 1)
	require.Contains(t, rep.Advice.Notes[0], "The key is ignored in Idempotency-Key and in X-Idempotency-Key (bare)")
}

func TestAnotherKeyHeaderIsFoundAndUsable(t *testing.T) {
	t.Parallel()
	a := idemAPI(t, "X-Idempotency-Key")
	rep := runProbe(t, a, probe.Config{StatusURL: a.url("/idempotency/{key}")})

	require.Equal(t, probe.Usable, rep.Verdict, "%+v", rep.Findings)
	require.Equal(t, "X-Idempotency-Key", rep.Advice.KeyHeader)
	require.False(t, rep.Advice.QuoteKey)
	replay := finding(t, rep, probe.StepReplay)
	require.Equal(t, "replayed", replay.Outcome)
	require.Equal(t, probe.GradeChange, replay.Grade)
	// The default header, bare then quoted, is refused as a missing key;
	// the other header is accepted, then replayed.
	var got []string
	for _, e := range replay.Exchanges {
		got = append(got, fmt.Sprintf("%s %s %d %s", e.KeyHeader, e.KeyForm, e.Status, e.ProblemType))
	}
	require.Equal(t, []string{
		"Idempotency-Key bare 400 urn:idem:problem:key-missing",
		"Idempotency-Key sf-string 400 urn:idem:problem:key-missing",
		"X-Idempotency-Key bare 201 ",
		"X-Idempotency-Key bare 201 ",
	}, got)
	require.Equal(t, "Idempotent-Replayed", replay.Exchanges[3].ReplayHeader)
	// Every later step used the header found.
	for _, f := range rep.Findings[1:] {
		for _, e := range f.Exchanges {
			require.Equal(t, "X-Idempotency-Key", e.KeyHeader, "step %s", f.Step)
		}
	}
	require.Equal(t, "both/ok", outcomes(rep)[probe.StepKeyForm])
	require.Equal(t, "idem-format/ok", outcomes(rep)[probe.StepStatus])
}

func TestAServerThatReplaysWithoutAPayloadCheck(t *testing.T) {
	t.Parallel()
	// fiber's middleware: key alone, waits on a running key, no replay
	// header, no payload check.
	a := keyedAPI(t, &keyed{wait: true})
	rep := runProbe(t, a, probe.Config{})

	require.Equal(t, map[string]string{
		probe.StepReplay:        "replayed/ok",
		probe.StepMismatch:      "replayed-first/warn",
		probe.StepConcurrent:    "one-execution/ok",
		probe.StepOtherEndpoint: "not-requested/skipped",
		probe.StepStatus:        "not-requested/skipped",
		probe.StepKeyForm:       "both/ok",
	}, outcomes(rep))
	replay := finding(t, rep, probe.StepReplay)
	require.Empty(t, replay.Exchanges[1].ReplayHeader)
	require.Contains(t, replay.Summary, "no replay header")
	require.Contains(t, replay.Summary, "cannot be told apart")
	mismatch := finding(t, rep, probe.StepMismatch)
	require.Equal(t, mismatch.Exchanges[0].BodySHA256, mismatch.Exchanges[1].BodySHA256, "the first answer came back for the other body")
	require.Equal(t, probe.Safe, rep.Verdict, "a warning is not a change: idem never sends another body under a key")
	require.True(t, rep.Complete, "the steps not run were not asked for")
	require.Equal(t, "idem.ReplayStatus()", rep.Advice.Status)
}

func TestAServerThatRefusesAMismatchWith417(t *testing.T) {
	t.Parallel()
	// express-idempotency: 417 on another payload, 409 without Retry-After
	// while a key runs, no replay header.
	a := keyedAPI(t, &keyed{checkPayload: true, mismatch: http.StatusExpectationFailed})
	rep := runProbe(t, a, probe.Config{})

	mismatch := finding(t, rep, probe.StepMismatch)
	require.Equal(t, "refused/ok", mismatch.Outcome+"/"+string(mismatch.Grade), mismatch.Summary)
	require.Equal(t, 417, mismatch.Exchanges[1].Status)
	require.Contains(t, mismatch.Summary, "HTTP 417")
	require.Contains(t, mismatch.Summary, "ErrRejected")
	conc := finding(t, rep, probe.StepConcurrent)
	require.Equal(t, "in-progress-409", conc.Outcome, conc.Summary)
	require.Contains(t, conc.Summary, "without Retry-After")
	require.Equal(t, probe.Safe, rep.Verdict)
	require.Equal(t, int64(4), a.orders.Load(), "replay, mismatch, concurrent, key form: one order each")
}

func TestAServerThatWaitsInsteadOf409(t *testing.T) {
	t.Parallel()
	a := keyedAPI(t, &keyed{checkPayload: true, mismatch: http.StatusUnprocessableEntity, wait: true, replayHeader: "Idempotency-Replayed"})
	rep := runProbe(t, a, probe.Config{})

	conc := finding(t, rep, probe.StepConcurrent)
	require.Equal(t, "one-execution/ok", conc.Outcome+"/"+string(conc.Grade), conc.Summary)
	require.ElementsMatch(t, []int{201, 201}, []int{conc.Exchanges[0].Status, conc.Exchanges[1].Status})
	require.ElementsMatch(t, []string{"", "Idempotency-Replayed"}, []string{conc.Exchanges[0].ReplayHeader, conc.Exchanges[1].ReplayHeader})
	require.Contains(t, conc.Summary, "marked Idempotency-Replayed")
	replay := finding(t, rep, probe.StepReplay)
	require.Equal(t, "Idempotency-Replayed", replay.Exchanges[1].ReplayHeader, "the spelling the server uses")
	require.Equal(t, probe.Safe, rep.Verdict)
	require.Equal(t, int64(4), a.orders.Load(), "replay, mismatch, concurrent, key form: one order each")
}

func TestAServerThatDemandsQuotedKeys(t *testing.T) {
	t.Parallel()
	a := keyedAPI(t, &keyed{checkPayload: true, mismatch: http.StatusUnprocessableEntity, quotedOnly: true, replayHeader: "Idempotent-Replayed"})
	rep := runProbe(t, a, probe.Config{})

	require.Equal(t, probe.Usable, rep.Verdict)
	require.True(t, rep.Advice.QuoteKey)
	require.Empty(t, rep.Advice.KeyHeader)
	replay := finding(t, rep, probe.StepReplay)
	require.Equal(t, []int{400, 201, 201}, []int{replay.Exchanges[0].Status, replay.Exchanges[1].Status, replay.Exchanges[2].Status})
	require.Equal(t, "sf-string", replay.Exchanges[2].KeyForm)
	form := finding(t, rep, probe.StepKeyForm)
	require.Equal(t, "sf-string-only", form.Outcome)
	require.Equal(t, probe.GradeChange, form.Grade)
	require.Zero(t, form.Requests, "the bare form was already refused: nothing more to send")
	require.Contains(t, rep.Advice.GoCode(), "QuoteKey:  true")
}

func TestABudgetTooSmallSkipsStepsAndSaysSo(t *testing.T) {
	t.Parallel()
	a := idemAPI(t, "")
	rep := runProbe(t, a, probe.Config{MaxRequests: 5, StatusURL: a.url("/idempotency/{key}"), OtherURL: a.url("/refunds")})

	require.Equal(t, 4, rep.Requests, "replay and mismatch; the 2 of every later step do not fit in the 1 left")
	require.False(t, rep.Complete)
	o := outcomes(rep)
	require.Equal(t, "replayed/ok", o[probe.StepReplay])
	require.Equal(t, "key-conflict/ok", o[probe.StepMismatch])
	for _, s := range []string{probe.StepConcurrent, probe.StepOtherEndpoint, probe.StepStatus, probe.StepKeyForm} {
		f := finding(t, rep, s)
		require.Equal(t, probe.GradeSkipped, f.Grade, s)
		require.Contains(t, f.Summary, "1 of the 5 allowed (MaxRequests) are left", s)
	}
}

func TestTheBudgetBoundsTheTriesOfOtherHeaders(t *testing.T) {
	t.Parallel()
	a := plainAPI(t)
	rep := runProbe(t, a, probe.Config{MaxRequests: 3})
	require.Equal(t, 2, rep.Requests)
	require.Equal(t, probe.NotSafe, rep.Verdict)
	require.Contains(t, rep.Findings[1].Summary, "X-Idempotency-Key (bare) was not tried")
}

func TestARefusedFirstRequestStopsWithWhatToFix(t *testing.T) {
	t.Parallel()
	const secret = "Bearer sk_live_probe_secret_42"
	for _, tc := range []struct {
		name     string
		handler  http.HandlerFunc
		requests int
		want     []string
	}{
		{"credentials", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "bad token "+r.Header.Get("Authorization"), http.StatusUnauthorized)
		}, 1, []string{"answered HTTP 401 to the first request", "the credentials are missing or refused", "Config.Header"}},
		{"body", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"error":"quantity must be positive","auth":%q}`, r.Header.Get("Authorization"))
		}, 3, []string{"answered HTTP 400 to the first request under every key form tried (Idempotency-Key (bare), Idempotency-Key (sf-string), X-Idempotency-Key (bare))",
			"fix the request body", "quantity must be positive"}},
		{"url", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }, 1, []string{"HTTP 404", "check the URL and the method"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := &api{}
			start(t, a, tc.handler)
			rep, err := probe.Run(context.Background(), probe.Config{URL: a.url("/orders"), Body: []byte(orderBody),
				Header: http.Header{"Authorization": {secret}}})
			var ae *probe.AnswerError
			require.ErrorAs(t, err, &ae)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
			require.Equal(t, int64(tc.requests), a.requests.Load())
			require.Equal(t, tc.requests, rep.Requests)
			js, jerr := json.Marshal(rep)
			require.NoError(t, jerr)
			for _, out := range []string{err.Error(), string(js), fmt.Sprintf("%+v", rep)} {
				require.NotContains(t, out, "sk_live_probe_secret_42")
			}
		})
	}
}

func TestCredentialsAreSentButNeverReported(t *testing.T) {
	t.Parallel()
	const token = "tok_7f3a9c_never_print_me"
	a, mux := idemMux(t, "")
	var mu sync.Mutex
	var seen []string
	start(t, a, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("X-Api-Key"))
		mu.Unlock()
		if r.Header.Get("X-Api-Key") != token {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	rep := runProbe(t, a, probe.Config{Header: http.Header{"X-Api-Key": {token}}, StatusURL: a.url("/idempotency/{key}")})
	require.Equal(t, probe.Safe, rep.Verdict)
	require.Len(t, seen, rep.Requests)
	for _, v := range seen {
		require.Equal(t, token, v, "every request, status checks included, carries the credential")
	}
	js, err := json.Marshal(rep)
	require.NoError(t, err)
	require.NotContains(t, string(js), token)
	require.NotContains(t, fmt.Sprintf("%+v", rep), token)
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  probe.Config
		want string
	}{
		{probe.Config{}, "URL is required"},
		{probe.Config{URL: "/orders"}, "must be an absolute http or https URL"},
		{probe.Config{URL: "https://user:pw@api.example.com/orders"}, "URL must not carry credentials"},
		{probe.Config{URL: "https://api.example.com/orders", Method: "PO ST"}, `Method "PO ST"`},
		{probe.Config{URL: "https://api.example.com/orders", KeyHeader: "Key:"}, `KeyHeader "Key:"`},
		{probe.Config{URL: "https://api.example.com/orders", StatusURL: "https://api.example.com/idempotency"}, "must hold {key} once"},
		{probe.Config{URL: "https://api.example.com/orders", MaxRequests: 1}, "MaxRequests is 1"},
		{probe.Config{URL: "https://api.example.com/orders", Header: http.Header{"Idempotency-Key": {"x"}}}, "Header sets Idempotency-Key"},
		{probe.Config{URL: "https://api.example.com/orders", OtherURL: "ftp://x"}, "OtherURL"},
	} {
		_, err := probe.Run(context.Background(), tc.cfg)
		require.ErrorIs(t, err, probe.ErrInvalidConfig, tc.want)
		require.Contains(t, err.Error(), tc.want)
	}
}

func TestANonJSONBodySkipsTheMismatchStepAndSaysWhy(t *testing.T) {
	t.Parallel()
	a := idemAPI(t, "")
	rep := runProbe(t, a, probe.Config{Body: []byte("item=book&quantity=1")})
	f := finding(t, rep, probe.StepMismatch)
	require.Equal(t, probe.GradeSkipped, f.Grade)
	require.Contains(t, f.Summary, "the body is not JSON")
	require.Contains(t, f.Summary, "--other-body")

	// With an other body given, it runs.
	b := idemAPI(t, "")
	rep = runProbe(t, b, probe.Config{Body: []byte("item=book"), OtherBody: []byte("item=pen")})
	require.Equal(t, "key-conflict", finding(t, rep, probe.StepMismatch).Outcome)
}

func TestAStatusEndpointOfAnotherShapeNeedsAnAdapter(t *testing.T) {
	t.Parallel()
	k := &keyed{checkPayload: true, mismatch: http.StatusUnprocessableEntity, replayHeader: "X-Idempotent-Replayed"}
	a := &api{}
	k.a, k.header = a, "Idempotency-Key"
	mux := http.NewServeMux()
	mux.Handle("POST /orders", k)
	mux.HandleFunc("GET /requests/{key}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"phase":"done"}`) // 200 for any key, even one never used
	})
	start(t, a, mux)
	rep := runProbe(t, a, probe.Config{StatusURL: a.url("/requests/{key}")})

	f := finding(t, rep, probe.StepStatus)
	require.Equal(t, "other-format", f.Outcome)
	require.Equal(t, probe.GradeChange, f.Grade)
	require.Contains(t, f.Summary, "not in idem's status format")
	require.Contains(t, f.Summary, "a never-used key got HTTP 200, not 404")
	require.Equal(t, probe.Usable, rep.Verdict)
	require.Equal(t, "idem.ReplayStatus()", rep.Advice.Status, "the replay works meanwhile")
	require.Equal(t, "X-Idempotent-Replayed", finding(t, rep, probe.StepReplay).Exchanges[1].ReplayHeader)
}

func TestTheKeyOnAnotherEndpoint(t *testing.T) {
	t.Parallel()
	// Keyed by the key alone (fiber, gopotency): the other endpoint gets
	// this one's answer.
	a := keyedAPI(t, &keyed{wait: true})
	rep := runProbe(t, a, probe.Config{OtherURL: a.url("/refunds")})
	f := finding(t, rep, probe.StepOtherEndpoint)
	require.Equal(t, "same-entry-replayed/warn", f.Outcome+"/"+string(f.Grade), f.Summary)
	require.Equal(t, a.url("/refunds"), f.Exchanges[1].URL)
	require.Equal(t, f.Exchanges[0].BodySHA256, f.Exchanges[1].BodySHA256)

	// Keyed by method and path (hono): a new entry, a new order.
	b := keyedAPI(t, &keyed{scopeByPath: true, checkPayload: true, mismatch: http.StatusUnprocessableEntity})
	rep = runProbe(t, b, probe.Config{OtherMethod: "PUT"})
	f = finding(t, rep, probe.StepOtherEndpoint)
	require.Equal(t, "new-entry/ok", f.Outcome+"/"+string(f.Grade), f.Summary)
	require.Equal(t, "PUT", f.Exchanges[1].Method)
	require.NotEqual(t, f.Exchanges[0].BodySHA256, f.Exchanges[1].BodySHA256)
}

// roundTripper is an application's own transport around net/http's, which
// the probe cannot reconfigure.
type roundTripper struct{ base http.RoundTripper }

func (rt roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	return rt.base.RoundTrip(r)
}

// An endpoint that closes its connection after reading a request, before
// answering, must not receive it again: net/http re-sends a request that
// carries an Idempotency-Key on a new connection by itself when a reused
// one dies, and the probe's budget counts what reaches the wire.
func TestTheBudgetHoldsWhenTheEndpointDropsTheConnection(t *testing.T) {
	t.Parallel()
	for name, hc := range map[string]*http.Client{
		"default client":          nil,
		"the caller's transport":  {Transport: &http.Transport{}},
		"a transport wrapping it": {Transport: roundTripper{&http.Transport{}}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := startDroppingTheSecondRequest(t)
			rep, err := probe.Run(context.Background(), probe.Config{URL: a.url("/orders"), Body: []byte(orderBody), MaxRequests: 2, HTTPClient: hc})
			require.NoError(t, err)
			require.LessOrEqual(t, a.requests.Load(), int64(2), "the endpoint received more than MaxRequests; the report says %d", rep.Requests)
			require.Equal(t, int64(rep.Requests), a.requests.Load(), "the report's count and the server's")
			replay := finding(t, rep, probe.StepReplay)
			require.Len(t, replay.Exchanges, 2)
			require.NotEmpty(t, replay.Exchanges[1].Error, "the dropped request is reported unanswered, not answered by a re-send")
		})
	}
}

// startDroppingTheSecondRequest starts an endpoint that creates orders,
// but reads the second request whole, then closes its connection without
// an answer: the order may exist.
func startDroppingTheSecondRequest(t *testing.T) *api {
	t.Helper()
	a := &api{}
	start(t, a, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.requests.Load() != 2 {
			a.create(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	return a
}

// A transport of the application's own type is not reconfigured, and a
// request without a body is replayable whatever the probe does: when such
// a transport, shared with the application, holds a connection the
// application left idle, net/http may send a probe request again on a new
// one, and the report counts what reached the endpoint.
func TestTheReportCountsTheTransportsOwnResends(t *testing.T) {
	t.Parallel()
	a := startDroppingTheSecondRequest(t)
	hc := &http.Client{Transport: roundTripper{&http.Transport{}}}
	// The application's own request leaves its connection idle.
	resp, err := hc.Get(a.url("/health"))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	rep, err := probe.Run(context.Background(), probe.Config{URL: a.url("/orders"), Body: []byte{}, MaxRequests: 2, HTTPClient: hc})
	require.NoError(t, err)
	require.Equal(t, int64(3), a.requests.Load(), "net/http re-sent the dropped request on a new connection")
	require.Equal(t, 2, rep.Requests, "the report counts the re-send")
	replay := finding(t, rep, probe.StepReplay)
	require.Equal(t, 1, replay.Exchanges[0].Resent)
}

// A transport the probe cannot reconfigure (the application's wrapper
// around net/http's) and a request without a body: net/http would send it
// again by itself on a new connection when a reused one dies, so the
// probe must never leave a connection to reuse.
func TestTheBudgetHoldsForABodilessRequestThroughAWrappedTransport(t *testing.T) {
	t.Parallel()
	a := startDroppingTheSecondRequest(t)
	hc := &http.Client{Transport: roundTripper{&http.Transport{}}}
	rep, err := probe.Run(context.Background(), probe.Config{URL: a.url("/orders"), MaxRequests: 2, HTTPClient: hc})
	require.NoError(t, err)
	require.LessOrEqual(t, a.requests.Load(), int64(2), "the endpoint received more than MaxRequests; the report says %d", rep.Requests)
	require.Equal(t, int64(rep.Requests), a.requests.Load(), "the report's count and the server's")
}

// The same through a proxy (as HTTP_PROXY configures one): the requests
// reach the proxy in absolute form, over connections net/http pools the
// same way.
func TestTheBudgetHoldsThroughAProxy(t *testing.T) {
	t.Parallel()
	a := startDroppingTheSecondRequest(t)
	proxy, err := url.Parse(a.srv.URL)
	require.NoError(t, err)
	hc := &http.Client{Transport: roundTripper{&http.Transport{Proxy: http.ProxyURL(proxy)}}}
	rep, err := probe.Run(context.Background(), probe.Config{URL: "http://api.example.test/orders", MaxRequests: 2, HTTPClient: hc})
	require.NoError(t, err)
	require.LessOrEqual(t, a.requests.Load(), int64(2), "the proxy received more than MaxRequests; the report says %d", rep.Requests)
	require.Equal(t, int64(rep.Requests), a.requests.Load(), "the report's count and the proxy's")
}
