package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestStatusAnswerSetCookieInLowerCaseIsNeverJournaled: a status endpoint
// carries the stored response's header as JSON, whose names need not be
// canonical. The journal never holds Set-Cookie (doc.go: "Set-Cookie is
// dropped from stored responses"), whatever case the status answer spells
// it in.
func TestStatusAnswerSetCookieInLowerCaseIsNeverJournaled(t *testing.T) {
	t.Parallel()
	const secret = "sess_5e6f7a8b9c0d1e2f"
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet { // the status endpoint
			w.WriteHeader(http.StatusOK)
			fmt.Fprintf(w, `{"key":%q,"state":"completed","response":{"status":201,"header":{"set-cookie":["session=%s"],"x-secret-token":["%s"]},"body":"{}"}}`,
				r.PathValue("key"), secret, secret)
			return
		}
		dropConn(w) // the attempt's answer is lost: the client asks the status endpoint
	})
	srv.routeStatus()
	c, j := newClient(t, idem.Config{
		BaseURL:       srv.URL,
		Status:        idem.StatusEndpoint(srv.URL + "/status"),
		Retry:         fastRetry(),
		SecretHeaders: []string{"X-Secret-Token"},
	})
	res, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders"})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	for name := range res.Header {
		assert.False(t, strings.EqualFold(name, "Set-Cookie"), "the result carries Set-Cookie: %v", res.Header)
	}
	require.NoError(t, j.Close())
	assertJournalHoldsNo(t, j, secret)
}

// TestStatusAnswerHeaderNamesAreCanonical: the stored answer's header names
// are canonical, whatever the status endpoint spelled them as, so that
// Header.Get finds them; the values of one name spelled several ways are
// merged, in one order (the canonical spelling's, then the others' sorted
// by name), the same on every call.
func TestStatusAnswerHeaderNamesAreCanonical(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			w.WriteHeader(http.StatusOK)
			fmt.Fprintf(w, `{"key":%q,"state":"completed","response":{"status":201,"header":{"content-type":["application/json"],"x-trace":["a"],"X-Trace":["b"],"x-TRACE":["c"]},"body":"{}"}}`,
				r.PathValue("key"))
			return
		}
		dropConn(w)
	})
	srv.routeStatus()
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/status"), Retry: fastRetry()})
	op := idem.Op{ID: "a", URL: "/orders"}
	res, err := c.Do(context.Background(), op)
	require.NoError(t, err)
	want := http.Header{"Content-Type": {"application/json"}, "X-Trace": {"b", "c", "a"}}
	assert.Equal(t, want, res.Header)
	again, err := c.Do(context.Background(), op) // from the journal
	require.NoError(t, err)
	assert.Equal(t, want, again.Header)
}

// TestAttemptAnswerWithLowerCaseNamesKeepsNoSecret: an attempt's answer
// goes through the same rule as a status answer's. net/http's names are
// canonical, but Config.HTTPClient's RoundTripper may be anything (a
// recording or caching layer, a test double) and give them in lower case.
func TestAttemptAnswerWithLowerCaseNamesKeepsNoSecret(t *testing.T) {
	t.Parallel()
	const secret = "sess_0a1b2c3d4e5f6a7b"
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Set-Cookie", "session="+secret)
		w.Header().Set("X-Secret-Token", secret)
		w.WriteHeader(http.StatusCreated)
	})
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	c, j := newClient(t, idem.Config{
		BaseURL:       srv.URL,
		Retry:         fastRetry(),
		SecretHeaders: []string{"x-secret-token"},
		HTTPClient:    &http.Client{Transport: lowerCaseNames{base}},
	})
	res, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders"})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	for name := range res.Header {
		assert.False(t, strings.EqualFold(name, "Set-Cookie") || strings.EqualFold(name, "X-Secret-Token"), "the result carries a secret: %v", res.Header)
	}
	require.NoError(t, j.Close())
	assertJournalHoldsNo(t, j, secret)
}

// lowerCaseNames is a RoundTripper that gives its answers' header names in
// lower case.
type lowerCaseNames struct{ rt http.RoundTripper }

func (l lowerCaseNames) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	h := make(http.Header, len(resp.Header))
	for name, values := range resp.Header {
		h[strings.ToLower(name)] = values
	}
	resp.Header = h
	return resp, nil
}
