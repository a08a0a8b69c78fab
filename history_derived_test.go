package idem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// review4Scenario drives one operation through the public API and returns
// its key.
type review4Scenario func(ctx context.Context, t *testing.T, c *idem.Client, base string) string

func review4HistoryOf(t *testing.T, j idem.Journal, key string) []string {
	t.Helper()
	h, err := j.History(t.Context(), key)
	require.NoError(t, err)
	out := make([]string, len(h))
	for i, ev := range h {
		if at := strings.IndexByte(ev.Owner, '#'); at >= 0 {
			ev.Owner = ev.Owner[:at] // the client adds a suffix of its own
		}
		out[i] = fmt.Sprintf("v%d %v %s %s->%s attempt=%d status=%d err=%q owner=%q",
			ev.Version, ev.Kind, ev.Detail, ev.From, ev.To, ev.Attempt, ev.StatusCode, ev.Error, ev.Owner)
	}
	return out
}

// Schema 5 derives the history of a Do answered at its first attempt from
// the settled row. Whatever the path, the SQLite journal's History (also
// after reopening the file) must read what the MemoryJournal's reads for
// the same sequence of calls.
func TestReview4SQLiteHistoryMatchesMemory(t *testing.T) {
	var fails atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/conflict":
			w.WriteHeader(http.StatusUnprocessableEntity)
		case "/flaky":
			if fails.Add(1)%2 == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusCreated)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	}))
	defer srv.Close()
	do := func(path string) review4Scenario {
		return func(ctx context.Context, t *testing.T, c *idem.Client, base string) string {
			res, err := c.Do(ctx, idem.Op{ID: "op", Method: http.MethodPost, URL: path, Body: []byte(`{}`)})
			if path == "/conflict" {
				require.ErrorIs(t, err, idem.ErrRejected)
				rec, err := c.Lookup(ctx, "", "op")
				require.NoError(t, err)
				return rec.Key
			}
			require.NoError(t, err)
			return res.Key
		}
	}
	scenarios := map[string]review4Scenario{
		"do-first-attempt": do("/ok"),
		"do-rejected":      do("/conflict"),
		"do-retried":       do("/flaky"),
		"do-twice": func(ctx context.Context, t *testing.T, c *idem.Client, base string) string {
			k := do("/ok")(ctx, t, c, base)
			do("/ok")(ctx, t, c, base)
			return k
		},
		"begin-send": func(ctx context.Context, t *testing.T, c *idem.Client, base string) string {
			op, err := c.Begin(ctx, idem.Op{ID: "op", Method: http.MethodPost, URL: "/ok", Body: []byte(`{}`)})
			require.NoError(t, err)
			_, err = op.Send(ctx)
			require.NoError(t, err)
			return op.Key()
		},
		"begin-cancel": func(ctx context.Context, t *testing.T, c *idem.Client, base string) string {
			op, err := c.Begin(ctx, idem.Op{ID: "op", Method: http.MethodPost, URL: "/ok", Body: []byte(`{}`)})
			require.NoError(t, err)
			require.NoError(t, c.Cancel(ctx, op.Key()))
			return op.Key()
		},
		"begin-resume": func(ctx context.Context, t *testing.T, c *idem.Client, base string) string {
			op, err := c.Begin(ctx, idem.Op{ID: "op", Method: http.MethodPost, URL: "/ok", Body: []byte(`{}`)})
			require.NoError(t, err)
			_, err = c.Resume(ctx)
			require.NoError(t, err)
			return op.Key()
		},
		"do-then-resume": func(ctx context.Context, t *testing.T, c *idem.Client, base string) string {
			k := do("/ok")(ctx, t, c, base)
			_, err := c.Resume(ctx)
			require.NoError(t, err)
			return k
		},
	}
	for name, sc := range scenarios {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			cfg := func(j idem.Journal) idem.Config {
				return idem.Config{Journal: j, BaseURL: srv.URL, Owner: "w1",
					Retry: idem.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}}
			}
			fails.Store(0)
			mem := idem.NewMemoryJournal()
			mc, err := idem.New(cfg(mem))
			require.NoError(t, err)
			mkey := sc(ctx, t, mc, srv.URL)
			require.NoError(t, mc.Close())
			want := review4HistoryOf(t, mem, mkey)

			fails.Store(0)
			path := filepath.Join(t.TempDir(), "j.db")
			sj, err := idem.OpenSQLite(path)
			require.NoError(t, err)
			sc2, err := idem.New(cfg(sj))
			require.NoError(t, err)
			skey := sc(ctx, t, sc2, srv.URL)
			require.NoError(t, sc2.Close())
			got := review4HistoryOf(t, sj, skey)
			require.NoError(t, sj.Close())
			assert.Equal(t, want, got, "SQLite's history against the MemoryJournal's")

			again, err := idem.OpenSQLite(path)
			require.NoError(t, err)
			defer again.Close()
			assert.Equal(t, want, review4HistoryOf(t, again, skey), "after reopening")
		})
	}
}

// An operation begun by one client and sent by another (its Resume), and
// one answered by the first then asked again by the second: SQLite's
// History reads as the MemoryJournal's.
func TestReview4SQLiteHistoryOfAnotherOwnersOperation(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	run := func(t *testing.T, j idem.Journal) (string, string) {
		ctx := t.Context()
		a, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Owner: "w1"})
		require.NoError(t, err)
		op, err := a.Begin(ctx, idem.Op{ID: "begun", Method: http.MethodPost, URL: "/ok", Body: []byte(`{}`)})
		require.NoError(t, err)
		res, err := a.Do(ctx, idem.Op{ID: "done", Method: http.MethodPost, URL: "/ok", Body: []byte(`{}`)})
		require.NoError(t, err)
		require.NoError(t, a.Close())
		b, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Owner: "w2"})
		require.NoError(t, err)
		_, err = b.Resume(ctx)
		require.NoError(t, err)
		_, err = b.Do(ctx, idem.Op{ID: "done", Method: http.MethodPost, URL: "/ok", Body: []byte(`{}`)})
		require.NoError(t, err)
		require.NoError(t, b.Close())
		return op.Key(), res.Key
	}
	mem := idem.NewMemoryJournal()
	mb, md := run(t, mem)
	path := filepath.Join(t.TempDir(), "j.db")
	sj, err := idem.OpenSQLite(path)
	require.NoError(t, err)
	sb, sd := run(t, sj)
	require.Greater(t, len(review4HistoryOf(t, mem, mb)), 2, "w2's Resume sent the begun operation: %v", review4HistoryOf(t, mem, mb))
	assert.Equal(t, review4HistoryOf(t, mem, mb), review4HistoryOf(t, sj, sb), "begun by w1, sent by w2's Resume")
	assert.Equal(t, review4HistoryOf(t, mem, md), review4HistoryOf(t, sj, sd), "answered for w1, asked again by w2")
	require.NoError(t, sj.Close())
	again, err := idem.OpenSQLite(path)
	require.NoError(t, err)
	defer again.Close()
	assert.Equal(t, review4HistoryOf(t, mem, mb), review4HistoryOf(t, again, sb), "after reopening")
	assert.Equal(t, review4HistoryOf(t, mem, md), review4HistoryOf(t, again, sd), "after reopening")
}
