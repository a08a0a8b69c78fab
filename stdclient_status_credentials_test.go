package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem"
)

// The credentials a request gives the standard client (an SDK's
// Authorization for its API) belong to that request's origin: "a write and
// its credentials never go elsewhere", and net/http itself drops
// Authorization on a redirect to another host. The call adds them to its
// status checks too, which go wherever Config.Status points: a status
// endpoint on another origin (a separate status service, a misconfigured
// URL) receives the API's bearer token. Status checks on another origin
// than the request's are authorized by Config.Authorize, which sees where
// each request goes, not by the call's credentials.
func TestStandardClientCredentialsDoNotGoToAStatusEndpointOfAnotherOrigin(t *testing.T) {
	t.Parallel()
	const token = "Bearer sk_live_api_only_1f2e3d"
	api := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		dropConn(w) // the write is applied, its answer lost: a status check follows
	})
	var (
		mu   sync.Mutex
		seen []string
	)
	status := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		// One entry per status check, its Authorization or "" (none).
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		key := strings.TrimPrefix(r.URL.Path, "/idempotency/")
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"key":%q,"state":"completed","response":{"status":201,"body":"{}"}}`, key)
	}))
	t.Cleanup(status.Close)
	c, _ := newClient(t, idem.Config{BaseURL: api.URL, Status: idem.StatusEndpoint(status.URL + "/idempotency"), Retry: fastRetry()})
	ctx, cancel := context.WithTimeout(idem.WithOperation(context.Background(), "op-1"), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/orders", strings.NewReader(`{"item":"book"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", token)
	resp, err := c.StandardClient().Do(req)
	if err == nil {
		_ = resp.Body.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	assert.NotEmpty(t, seen, "no status check reached the status endpoint (err %v)", err)
	for _, v := range seen {
		assert.NotEqual(t, token, v, "the API's credential was sent to a status endpoint on another origin (%s)", status.URL)
	}
}
