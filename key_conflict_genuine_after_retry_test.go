package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A genuine key conflict: with KeyDeterministic, a batch re-run on a
// machine that lost its journal sends the same key for the same operation
// ID, here with another payload. The server holds the key for the first
// run's request and answers the second's with 422 key-reused. When the
// second run's first attempt was shed with a 429 (refused before
// processing, as Classify reads it: nothing of it was applied) the 422 answers a retry, and
// is now read as "the key is an earlier attempt's": the outcome unknown,
// settled by the status check with the other request's stored answer
// (reported as this operation's success), or replayed for ever.
func TestAGenuineKeyConflictAfterAShedAttemptIsAKeyConflict(t *testing.T) {
	t.Parallel()
	for _, checker := range []string{"StatusEndpoint", "ReplayStatus"} {
		t.Run(checker, func(t *testing.T) {
			t.Parallel()
			var (
				mu     sync.Mutex
				stored = map[string]string{} // key -> body of the request it holds
				shed   = map[string]bool{}   // bodies whose first attempt was shed
				writes = map[string]int{}
			)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if key, ok := strings.CutPrefix(r.URL.Path, "/idempotency/"); ok {
					mu.Lock()
					body, held := stored[key]
					mu.Unlock()
					w.Header().Set("Content-Type", "application/json")
					if !held {
						w.WriteHeader(http.StatusNotFound)
						fmt.Fprintf(w, `{"key":%q,"state":"not_found"}`, key)
						return
					}
					fmt.Fprintf(w, `{"key":%q,"state":"completed","response":{"status":201,"body":%q}}`, key, `{"order_for":`+body+`}`)
					return
				}
				body, _ := io.ReadAll(r.Body)
				key := r.Header.Get("Idempotency-Key")
				mu.Lock()
				defer mu.Unlock()
				writes[string(body)]++
				held, ok := stored[key]
				switch {
				case ok && held != string(body) && !shed[string(body)]:
					shed[string(body)] = true
					// Load shedding, before the key is looked at: a 429, which
					// Classify itself reads as refused before processing.
					w.Header().Set("Retry-After", "0")
					w.WriteHeader(http.StatusTooManyRequests)
				case !ok:
					stored[key] = string(body)
					w.WriteHeader(http.StatusCreated)
					fmt.Fprintf(w, `{"order_for":%s}`, body)
				case held != string(body):
					w.Header().Set("Content-Type", "application/problem+json")
					w.WriteHeader(http.StatusUnprocessableEntity)
					fmt.Fprint(w, `{"type":"urn:idem:problem:key-reused","title":"key reused with another request"}`)
				default:
					w.Header().Set("Idempotent-Replayed", "true")
					w.WriteHeader(http.StatusCreated)
					fmt.Fprintf(w, `{"order_for":%s}`, body)
				}
			}))
			t.Cleanup(srv.Close)
			ns := uuid.New()
			status := idem.StatusChecker(idem.StatusEndpoint(srv.URL + "/idempotency"))
			if checker == "ReplayStatus" {
				status = idem.ReplayStatus()
			}
			cfg := func() idem.Config {
				return idem.Config{BaseURL: srv.URL, Keys: idem.KeyDeterministic, KeyNamespace: ns, Retry: fastRetry(), Status: status,
					Journal: openJournal(t, filepath.Join(t.TempDir(), "ops.db"))}
			}
			ctx := context.Background()
			first, _ := newClient(t, cfg())
			_, err := first.Do(ctx, orderOp("invoice-7", 1))
			require.NoError(t, err)

			rerun, _ := newClient(t, cfg()) // the journal lost: the same key again
			res, err := rerun.Do(ctx, orderOp("invoice-7", 2))
			if err == nil {
				t.Errorf("the re-run with another payload reported success with the other request's answer: %d %s", res.StatusCode, res.Body)
			}
			assert.True(t, errors.Is(err, idem.ErrKeyConflict), "the server said the key is held for another request: want ErrKeyConflict, got %v", err)
			rec, lerr := rerun.Lookup(ctx, "default", "invoice-7")
			require.NoError(t, lerr)
			mu.Lock()
			t.Logf("state %s; writes per body %v", rec.State, writes)
			mu.Unlock()
		})
	}
}
