package idem_test

// A full disk: the journal's write fails, the caller gets a clear error,
// nothing is sent twice and nothing acknowledged is lost; once space is
// back, the operation that failed is finished with one side effect.
//
// The disk is made full in a child process, two ways: a tiny tmpfs, where
// the machine lets the test mount one (ENOSPC, as on a real full disk), and
// a file size limit (RLIMIT_FSIZE: EFBIG), which needs no privilege.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/server"
)

func init() { children["full-disk"] = childFullDisk }

// fullDiskReport is what the child finds.
type fullDiskReport struct {
	Acked       int      // operations that succeeded before the disk filled
	FailedID    string   // the operation whose journal write failed
	FailedErr   string   // its error
	DiskFull    bool     // errors.Is(err, idem.ErrDiskFull)
	FileError   bool     // errors.As(err, *idem.FileError)
	SentBefore  bool     // the failed operation had reached the server when it failed
	Executions  []int    // executions per key on the server, at the end
	Settled     bool     // the failed operation succeeded once space was back
	LostAcked   []string // acknowledged operations not found intact afterwards
	Unrecovered string   // why recovery failed, if it did
	// Buffered outcomes that the failed commit rolled back and that were
	// run again, and those lost.
	Replayed, LostBuffered int64
}

// childFullDisk runs the scenario on IDEM_FULLDISK_DIR, freeing space as
// IDEM_FULLDISK_MODE says: "tmpfs" removes a filler file the parent wrote,
// "rlimit" raises the file size limit it set first.
func childFullDisk() error {
	dir, mode := os.Getenv("IDEM_FULLDISK_DIR"), os.Getenv("IDEM_FULLDISK_MODE")
	var limit syscall.Rlimit
	if mode == "rlimit" {
		// Writes past the limit fail with EFBIG instead of killing us.
		signal.Ignore(syscall.SIGXFSZ)
		if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &limit); err != nil {
			return err
		}
		small := limit
		small.Cur = 2 << 20
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &small); err != nil {
			return err
		}
	}
	free := func() error {
		if mode == "rlimit" {
			return syscall.Setrlimit(syscall.RLIMIT_FSIZE, &limit)
		}
		return os.Remove(filepath.Join(dir, "filler"))
	}

	// The server: the middleware and a handler that counts executions.
	var mu sync.Mutex
	executions := map[string]int{}
	mw, err := server.New(server.Config{Store: server.NewMemoryStore(), Scope: server.SingleTenant})
	if err != nil {
		return err
	}
	defer mw.Close()
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, _ := server.KeyFromContext(r.Context())
		mu.Lock()
		executions[key]++
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"key":%q}`, key)
	})))
	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
	srv := httptest.NewServer(mux)
	defer srv.Close()

	j, err := idem.OpenSQLite(filepath.Join(dir, "ops.db"))
	if err != nil {
		return err
	}
	defer j.Close()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/idempotency"),
		Retry: idem.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}})
	if err != nil {
		return err
	}
	defer c.Close()
	ctx := context.Background()
	body := []byte(strings.Repeat("x", 8000))
	var rep fullDiskReport
	var acked []string
	for i := range 5000 {
		id := fmt.Sprint("fill/op-", i)
		_, err := c.Do(ctx, idem.Op{ID: id, URL: "/orders", Body: body})
		if err == nil {
			acked = append(acked, id)
			continue
		}
		rep.FailedID, rep.FailedErr = id, err.Error()
		rep.DiskFull = errors.Is(err, idem.ErrDiskFull)
		var fe *idem.FileError
		rep.FileError = errors.As(err, &fe)
		var oe *idem.OperationError
		if errors.As(err, &oe) {
			mu.Lock()
			rep.SentBefore = executions[oe.Key] > 0
			mu.Unlock()
		}
		break
	}
	rep.Acked = len(acked)
	if rep.FailedID == "" {
		rep.Unrecovered = "the disk never filled"
		return json.NewEncoder(os.Stdout).Encode(rep)
	}

	// Space is back: Resume, then the same operation again.
	if err := free(); err != nil {
		return err
	}
	if _, err := c.Resume(ctx); err != nil {
		rep.Unrecovered = "resume: " + err.Error()
	}
	if res, err := c.Do(ctx, idem.Op{ID: rep.FailedID, URL: "/orders", Body: body}); err != nil {
		rep.Unrecovered = "do: " + err.Error()
	} else {
		rep.Settled = res.State == idem.StateSucceeded
	}
	for _, id := range acked {
		rec, err := j.Lookup(ctx, "default", id)
		if err != nil || rec.State != idem.StateSucceeded || string(rec.Body) != string(body) {
			rep.LostAcked = append(rep.LostAcked, id)
		}
	}
	st := j.Stats()
	rep.Replayed, rep.LostBuffered = st.Replayed, st.LostBuffered
	mu.Lock()
	for _, n := range executions {
		rep.Executions = append(rep.Executions, n)
	}
	mu.Unlock()
	return json.NewEncoder(os.Stdout).Encode(rep)
}

func TestFullDiskIsAClearErrorAndLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a disk")
	}
	t.Parallel()
	modes := []string{"rlimit"}
	tiny := filepath.Join(t.TempDir(), "tiny")
	require.NoError(t, os.Mkdir(tiny, 0o700))
	if err := syscall.Mount("tmpfs", tiny, "tmpfs", 0, "size=4m,mode=0700"); err == nil {
		t.Cleanup(func() { _ = syscall.Unmount(tiny, syscall.MNT_DETACH) })
		// Leave about 1.5 MB for the journal.
		require.NoError(t, os.WriteFile(filepath.Join(tiny, "filler"), make([]byte, 2500<<10), 0o600))
		modes = append(modes, "tmpfs")
	} else {
		t.Logf("no tmpfs (%v): the full disk is simulated by a file size limit only", err)
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			dir := tiny
			if mode == "rlimit" {
				dir = t.TempDir()
			}
			out, err := childCommand(t, "full-disk", "IDEM_FULLDISK_DIR="+dir, "IDEM_FULLDISK_MODE="+mode).Output()
			require.NoError(t, err)
			var rep fullDiskReport
			require.NoError(t, json.Unmarshal(out, &rep), "%s", out)
			t.Logf("%s: %d operations acknowledged, then %s failed (sent: %v): %s; %d buffered outcomes replayed",
				mode, rep.Acked, rep.FailedID, rep.SentBefore, rep.FailedErr, rep.Replayed)
			require.NotEmpty(t, rep.FailedID, rep.Unrecovered)
			assert.Positive(t, rep.Acked)
			assert.True(t, rep.DiskFull, "the error matches ErrDiskFull: %s", rep.FailedErr)
			assert.True(t, rep.FileError, "the error is a *FileError")
			assert.Contains(t, rep.FailedErr, "ops.db", "the error names the journal")
			assert.Contains(t, rep.FailedErr, "free space", "the error says what to do")
			assert.Empty(t, rep.Unrecovered)
			assert.True(t, rep.Settled, "once space is back, the failed operation finishes")
			assert.Empty(t, rep.LostAcked, "every acknowledged operation is intact")
			assert.Zero(t, rep.LostBuffered, "no buffered outcome was lost")
			require.Len(t, rep.Executions, rep.Acked+1, "one key per operation reached the server")
			for _, n := range rep.Executions {
				assert.Equal(t, 1, n, "nothing executed twice")
			}
		})
	}
}
