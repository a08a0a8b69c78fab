package idem_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// logRecords keeps every record a client logs, at every level.
type logRecords struct {
	mu   sync.Mutex
	recs []loggedRecord
}

type loggedRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	rec := loggedRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool { rec.attrs[a.Key] = a.Value.String(); return true })
	l.mu.Lock()
	l.recs = append(l.recs, rec)
	l.mu.Unlock()
	return nil
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

// resumePasses returns the records about a whole Resume pass (any message
// mentioning resume with a claimed count), at any level.
func (l *logRecords) resumePasses() []loggedRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []loggedRecord
	for _, r := range l.recs {
		if _, ok := r.attrs["claimed"]; ok && strings.Contains(r.msg, "resume") && !strings.Contains(r.msg, "progress") {
			out = append(out, r)
		}
	}
	return out
}

// A background resume logs one line per pass that did something, and
// passes that found nothing to do only at Debug: a quiet client's log
// stays quiet.
func TestBackgroundResumeLogsEachPassOnceAndIdlePassesAtDebug(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	logs := &logRecords{}
	retry := fastRetry()
	retry.MaxAttempts = 1
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: retry, ResumeInterval: 5 * time.Millisecond, Logger: slog.New(logs)})
	ctx := context.Background()
	_, err := c.Do(ctx, idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)})
	require.Error(t, err, "the only attempt got a 503")
	require.Eventually(t, func() bool {
		rec, err := c.Lookup(ctx, "", "order-1")
		return err == nil && rec.State == idem.StateSucceeded
	}, 10*time.Second, 5*time.Millisecond, "the background resume sends it again")
	// Some idle passes after the one that settled it.
	settled := len(logs.resumePasses())
	require.Eventually(t, func() bool { return len(logs.resumePasses()) >= settled+3 },
		10*time.Second, 5*time.Millisecond, "the background resume keeps running, and each pass is logged at some level")
	require.NoError(t, c.Close())

	worked := 0
	for _, r := range logs.resumePasses() {
		idle := r.attrs["claimed"] == "0" && r.attrs["expired"] == "0"
		if idle {
			assert.Equal(t, slog.LevelDebug, r.level, "an idle pass logged %q at %s: %v", r.msg, r.level, r.attrs)
			continue
		}
		assert.Equal(t, slog.LevelInfo, r.level, "a pass that did something logged %q at %s", r.msg, r.level)
		worked++
	}
	assert.Equal(t, 1, worked, "the one pass that settled the operation is logged once: %+v", logs.resumePasses())
}
