package idem_test

import (
	"bytes"
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

// review4Server answers every POST with a header of two values and a body;
// when gate is not nil, it waits for it before answering.
func review4Server(t *testing.T, gate chan struct{}, arrived chan struct{}) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if arrived != nil {
			select {
			case arrived <- struct{}{}:
			default:
			}
		}
		if gate != nil {
			<-gate
		}
		w.Header().Add("X-Review", "one")
		w.Header().Add("X-Review", "two")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("original-body"))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func review4Journals(t *testing.T) map[string]func(t *testing.T) idem.Journal {
	return map[string]func(t *testing.T) idem.Journal{
		"memory": func(t *testing.T) idem.Journal { return idem.NewMemoryJournal() },
		"sqlite": func(t *testing.T) idem.Journal {
			j, err := idem.OpenSQLite(filepath.Join(t.TempDir(), "j.db"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = j.Close() })
			return j
		},
	}
}

// A Result is its caller's: changing its Header (in place too) or Body
// changes nothing the journal holds, nor what a later Do, Get or Lookup
// returns; and a record Get returns is the caller's as well.
func TestReview4MutatingAResultChangesNothingStored(t *testing.T) {
	for name, open := range review4Journals(t) {
		t.Run(name, func(t *testing.T) {
			j := open(t)
			srv := review4Server(t, nil, nil)
			c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL})
			require.NoError(t, err)
			defer c.Close()
			ctx := t.Context()
			op := idem.Op{ID: "r4-1", Method: http.MethodPost, URL: "/x", Body: []byte(`{}`),
				Header: http.Header{"X-Req": {"req-value"}}}
			res, err := c.Do(ctx, op)
			require.NoError(t, err)
			require.Equal(t, []string{"one", "two"}, res.Header.Values("X-Review"))
			res.Header["X-Review"][0] = "CHANGED"
			res.Header.Set("X-Added", "1")
			if len(res.Body) > 0 {
				res.Body[0] = 'Z'
			}
			op.Header["X-Req"][0] = "CHANGED"

			rec, err := j.Get(ctx, res.Key)
			require.NoError(t, err)
			require.NotNil(t, rec.Response)
			assert.Equal(t, []string{"one", "two"}, rec.Response.Header.Values("X-Review"))
			assert.Empty(t, rec.Response.Header.Get("X-Added"))
			assert.Equal(t, "original-body", string(rec.Response.Body))
			assert.Equal(t, "req-value", rec.Header.Get("X-Req"))

			// Change what Get returned, in place.
			rec.Response.Header["X-Review"][1] = "CHANGED"
			rec.Response.Body[1] = 'Z'
			rec.Header["X-Req"][0] = "CHANGED"
			rec.Body = append(rec.Body[:0], 'Z')

			again, err := c.Do(ctx, idem.Op{ID: "r4-1", Method: http.MethodPost, URL: "/x", Body: []byte(`{}`),
				Header: http.Header{"X-Req": {"req-value"}}})
			require.NoError(t, err)
			assert.Equal(t, []string{"one", "two"}, again.Header.Values("X-Review"))
			assert.Equal(t, "original-body", string(again.Body))
			look, err := j.Lookup(ctx, "", "r4-1")
			if err == nil {
				assert.Equal(t, []string{"one", "two"}, look.Response.Header.Values("X-Review"))
				assert.Equal(t, "original-body", string(look.Response.Body))
				assert.Equal(t, "req-value", look.Header.Get("X-Req"))
				assert.Equal(t, `{}`, string(look.Body))
			}
		})
	}
}

// The standard client's *http.Response is its caller's: changing its
// Header changes nothing stored nor what the next call for the key gets.
func TestReview4MutatingAStandardResponseChangesNothingStored(t *testing.T) {
	for name, open := range review4Journals(t) {
		t.Run(name, func(t *testing.T) {
			j := open(t)
			srv := review4Server(t, nil, nil)
			c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL})
			require.NoError(t, err)
			defer c.Close()
			hc := c.StandardClient()
			send := func() *http.Response {
				req, err := http.NewRequestWithContext(idem.WithOperation(t.Context(), "r4-std"), http.MethodPost, srv.URL+"/x", strings.NewReader(`{}`))
				require.NoError(t, err)
				req.Header.Set("Idempotency-Key", "r4-std-key")
				req.Header.Set("X-Req", "req-value")
				resp, err := hc.Do(req)
				require.NoError(t, err)
				return resp
			}
			resp := send()
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			require.Equal(t, "original-body", string(b))
			require.Equal(t, []string{"one", "two"}, resp.Header.Values("X-Review"))
			resp.Header["X-Review"][0] = "CHANGED"
			resp.Header.Set("X-Added", "1")
			resp.Header.Del("Content-Type")

			again := send()
			b2, _ := io.ReadAll(again.Body)
			_ = again.Body.Close()
			assert.Equal(t, "original-body", string(b2))
			assert.Equal(t, []string{"one", "two"}, again.Header.Values("X-Review"))
			assert.Empty(t, again.Header.Get("X-Added"))
			var found bool
			for rec, err := range j.List(t.Context(), idem.Filter{}) {
				require.NoError(t, err)
				full, err := j.Get(t.Context(), rec.Key)
				require.NoError(t, err)
				rec = full
				if rec.Response == nil {
					continue
				}
				found = true
				assert.Equal(t, []string{"one", "two"}, rec.Response.Header.Values("X-Review"))
				assert.Empty(t, rec.Response.Header.Get("X-Added"))
				assert.Equal(t, "original-body", string(rec.Response.Body))
			}
			assert.True(t, found, "the operation is journaled with its response")
		})
	}
}

// Calls for one operation that share one attempt each get their own
// Result: a caller that changes its Result (header in place, body)
// changes no other caller's.
func TestReview4ConcurrentCallersGetTheirOwnCopies(t *testing.T) {
	for name, open := range review4Journals(t) {
		t.Run(name, func(t *testing.T) {
			j := open(t)
			gate, arrived := make(chan struct{}), make(chan struct{}, 1)
			srv := review4Server(t, gate, arrived)
			c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL})
			require.NoError(t, err)
			defer c.Close()
			const n = 6
			results := make([]*idem.Result, n)
			var wg sync.WaitGroup
			var start sync.WaitGroup
			start.Add(n)
			op := idem.Op{ID: "r4-shared", Method: http.MethodPost, URL: "/x", Body: []byte(`{}`)}
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					start.Done()
					res, err := c.Do(t.Context(), op)
					assert.NoError(t, err)
					results[i] = res
				}()
			}
			start.Wait()
			<-arrived
			close(gate)
			wg.Wait()
			for i, r := range results {
				require.NotNil(t, r, "caller %d", i)
			}
			// Each caller changes its own copy, then every other caller's
			// must be untouched.
			for i, r := range results {
				r.Header["X-Review"][0] = "CHANGED-" + string(rune('a'+i))
				if len(r.Body) > 0 {
					r.Body[0] = byte('a' + i)
				}
				for k, other := range results {
					if k <= i {
						continue
					}
					assert.Equal(t, "one", other.Header["X-Review"][0], "caller %d's header after caller %d changed its own", k, i)
					assert.True(t, bytes.Equal([]byte("original-body"), other.Body), "caller %d's body after caller %d changed its own: %q", k, i, other.Body)
				}
			}
		})
	}
}
