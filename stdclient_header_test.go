package idem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// Each call through one standard client journals and sends its own
// request's headers, whatever the calls before it sent: the same headers
// again (which the RoundTripper journals as the header it journaled
// last), another value, one header fewer or more, two values, another
// spelling; and a caller that changes its request's header values once a
// call has returned changes nothing journaled or sent for it or for the
// calls after it.
func TestStandardClientJournalsEachCallsOwnHeaders(t *testing.T) {
	t.Parallel()
	for _, journal := range []string{"memory", "sqlite"} {
		t.Run(journal, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			sent := map[string]http.Header{} // by body
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				mu.Lock()
				sent[string(body)] = r.Header.Clone()
				mu.Unlock()
				w.WriteHeader(http.StatusCreated)
			}))
			t.Cleanup(srv.Close)
			var j idem.Journal = idem.NewMemoryJournal()
			if journal == "sqlite" {
				j = openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
			}
			c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry()})
			std := c.StandardClient()
			json := "application/json"
			calls := []http.Header{
				{"Content-Type": {json}, "X-Trace": {"a"}},
				{"Content-Type": {json}, "X-Trace": {"a"}},
				{"Content-Type": {json}, "X-Trace": {"b"}},
				{"Content-Type": {json}},
				{"Content-Type": {json}, "X-Trace": {"a"}, "X-Extra": {"e"}},
				{"Content-Type": {json}, "X-Trace": {"a"}},
				{"Content-Type": {json}, "X-Trace": {"a", "c"}},
				{"Content-Type": {json}, "X-Trace": {"a"}},
				{"content-type": {json}, "X-Trace": {"a"}},
				{"Content-Type": {json}, "X-Trace": {"a"}},
				{"Content-Type": {json}, "X-Other": {"a"}},
				{"Content-Type": {json}, "X-Trace": {"a"}},
				{"Content-Type": {json}, "X-Trace": {""}},
				{"Content-Type": {json}, "X-Trace": {}},
				{"Content-Type": {json}, "X-Trace": {"a"}},
			}
			names := []string{"Content-Type", "X-Trace", "X-Extra", "X-Other"}
			canonical := func(h http.Header) http.Header {
				c := http.Header{}
				for name, values := range h {
					c[http.CanonicalHeaderKey(name)] = values
				}
				return c
			}
			lines := func(h http.Header, name string) []string {
				if v := h.Values(name); len(v) > 0 {
					return v
				}
				return nil // no line on the wire
			}
			bg := context.Background()
			for i, header := range calls {
				id := fmt.Sprint("call-", i)
				req, err := http.NewRequestWithContext(idem.WithOperation(bg, id), http.MethodPost, srv.URL+"/orders", strings.NewReader(id))
				require.NoError(t, err)
				for name, values := range header {
					req.Header[name] = append([]string(nil), values...)
				}
				req.Header.Set("Authorization", "Bearer t")
				req.Header.Set("Idempotency-Key", "sdk-"+id)
				resp, err := std.Do(req)
				require.NoError(t, err, id)
				require.NoError(t, resp.Body.Close())
				// The caller reuses its request's values once the call returned.
				for _, vs := range req.Header {
					for k := range vs {
						vs[k] = "changed"
					}
				}

				want := canonical(header)
				rec, err := j.Lookup(bg, "default", id)
				require.NoError(t, err)
				mu.Lock()
				got := sent[id]
				mu.Unlock()
				require.NotNil(t, got, "%s was sent", id)
				for _, name := range names {
					assert.Equal(t, lines(want, name), lines(rec.Header, name), "%s: journaled %s", id, name)
					assert.Equal(t, lines(want, name), lines(got, name), "%s: sent %s", id, name)
				}
				assert.Empty(t, rec.Header.Values("Authorization"), id)
				assert.Empty(t, rec.Header.Values("Idempotency-Key"), id)
				assert.Equal(t, []string{"Bearer t"}, got.Values("Authorization"), id)
				assert.Equal(t, []string{rec.Key}, got.Values("Idempotency-Key"), id)
			}
			// Every record, read again at the end, is still its call's.
			for i, header := range calls {
				id := fmt.Sprint("call-", i)
				rec, err := j.Lookup(bg, "default", id)
				require.NoError(t, err)
				for _, name := range names {
					assert.Equal(t, lines(canonical(header), name), lines(rec.Header, name), "%s at the end: journaled %s", id, name)
				}
			}
		})
	}
}
