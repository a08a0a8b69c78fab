package idem_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// payments is a server that is not idem's: it keeps keys and answers
// GET /v2/requests/{key}/outcome with
// {"phase":"done|running|unseen","http_status":…,"payload":…}.
type payments struct {
	*httptest.Server
	mu       sync.Mutex
	outcomes map[string]json.RawMessage // key -> payload
	phase    string                     // forced phase, for the test
	asked    []string                   // the key header and token of each status request
	posts    int
}

func newPayments(t *testing.T) *payments {
	p := &payments{outcomes: map[string]json.RawMessage{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v2/payments", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		p.mu.Lock()
		p.posts++
		payload, seen := p.outcomes[key]
		if !seen {
			payload = json.RawMessage(fmt.Sprintf(`{"payment":"pay_%d"}`, len(p.outcomes)+1))
			p.outcomes[key] = payload
		}
		first := p.posts == 1
		p.mu.Unlock()
		if first { // applied, and the answer is lost
			dropConn(w)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(payload)
	})
	mux.HandleFunc("GET /v2/requests/{key}/outcome", func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		p.mu.Lock()
		p.asked = append(p.asked, r.Header.Get("Idempotency-Key")+" "+r.Header.Get("Authorization"))
		payload, seen := p.outcomes[key]
		phase := p.phase
		p.mu.Unlock()
		switch {
		case phase != "":
		case seen:
			phase = "done"
		default:
			phase = "unseen"
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"phase": phase, "http_status": 201, "payload": payload})
	})
	p.Server = httptest.NewServer(mux)
	t.Cleanup(p.Close)
	return p
}

// outcomeAdapter is the adapter a user writes for that server: the few
// lines StatusAdapter asks for.
func outcomeAdapter(base string) idem.StatusAdapter {
	return idem.StatusAdapter{
		Name: "payments outcome",
		URL:  base + "/v2/requests/{key}/outcome",
		Decode: func(code int, _ http.Header, body []byte) (idem.Status, error) {
			var v struct {
				Phase      string          `json:"phase"`
				HTTPStatus int             `json:"http_status"`
				Payload    json.RawMessage `json:"payload"`
			}
			if err := json.Unmarshal(body, &v); err != nil {
				return idem.Status{}, err
			}
			switch v.Phase {
			case "done":
				return idem.Status{State: idem.StatusCompleted, Response: &idem.Response{StatusCode: v.HTTPStatus, Body: v.Payload}}, nil
			case "running":
				return idem.Status{State: idem.StatusProcessing}, nil
			case "unseen":
				return idem.Status{State: idem.StatusNotFound}, nil
			}
			return idem.Status{}, fmt.Errorf("unknown phase %q", v.Phase)
		},
	}
}

func TestStatusAdapterSettlesAgainstAnotherShape(t *testing.T) {
	t.Parallel()
	api := newPayments(t)
	c, j := newClient(t, idem.Config{BaseURL: api.URL, Status: outcomeAdapter(api.URL), Retry: fastRetry(),
		Authorize: func(r *http.Request) error { r.Header.Set("Authorization", "Bearer t"); return nil }})
	ctx := context.Background()
	res, err := c.Do(ctx, idem.Op{ID: "pay-1", URL: "/v2/payments", Body: []byte(`{"amount":100}`)})
	require.NoError(t, err, "the adapter found the payment the lost answer was about")
	assert.JSONEq(t, `{"payment":"pay_1"}`, string(res.Body))
	assert.True(t, res.Replayed)
	api.mu.Lock()
	assert.Equal(t, 1, api.posts, "settled by the status check, not by a second POST")
	assert.Equal(t, []string{res.Key + " Bearer t"}, api.asked, "the status request carries the key and the credentials")
	api.mu.Unlock()
	rec, err := j.Lookup(ctx, "default", "pay-1")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
}

func TestStatusAdapterErrorsNameIt(t *testing.T) {
	t.Parallel()
	api := newPayments(t)
	api.phase = "archived"
	policy := fastRetry()
	policy.MaxStatusChecks = 2
	c, j := newClient(t, idem.Config{BaseURL: api.URL, Status: outcomeAdapter(api.URL), Retry: policy})
	ctx := context.Background()
	_, err := c.Do(ctx, idem.Op{ID: "pay-1", URL: "/v2/payments", Body: []byte(`{"amount":100}`)})
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "an answer the adapter cannot read leaves the outcome unknown")
	require.ErrorIs(t, err, idem.ErrBadStatus)
	assert.Contains(t, err.Error(), `status check by payments outcome:`)
	assert.Contains(t, err.Error(), `unknown phase "archived"`)
	rec, err := j.Lookup(ctx, "default", "pay-1")
	require.NoError(t, err)
	assert.Contains(t, rec.LastError, `unknown phase "archived"`)
}

func TestNewRefusesAnIncompleteStatusAdapter(t *testing.T) {
	t.Parallel()
	decode := func(int, http.Header, []byte) (idem.Status, error) { return idem.Status{}, nil }
	for name, a := range map[string]idem.StatusAdapter{
		"no name":           {URL: "https://api.example.com/requests/{key}", Decode: decode},
		"no {key}":          {Name: "x", URL: "https://api.example.com/requests", Decode: decode},
		"relative URL":      {Name: "x", URL: "/requests/{key}", Decode: decode},
		"no decode":         {Name: "x", URL: "https://api.example.com/requests/{key}"},
		"not http or https": {Name: "x", URL: "ftp://api.example.com/{key}", Decode: decode},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := idem.New(idem.Config{Journal: idem.NewMemoryJournal(), Status: a})
			require.ErrorIs(t, err, idem.ErrInvalidConfig)
			assert.True(t, strings.Contains(err.Error(), "StatusAdapter"), err.Error())
		})
	}
}
