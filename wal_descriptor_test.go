package idem_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func init() {
	// review4-writer: a second process on the journal $R4_JOURNAL, which
	// runs 30 Dos against $R4_URL, then closes it ($R4_CLOSE=1) or is
	// killed by its parent once it prints "done".
	children["review4-writer"] = func() error {
		j, err := idem.OpenSQLite(os.Getenv("R4_JOURNAL"), idem.SQLiteWALLimit(4096))
		if err != nil {
			return err
		}
		c, err := idem.New(idem.Config{Journal: j, BaseURL: os.Getenv("R4_URL")})
		if err != nil {
			return err
		}
		for i := range 30 {
			if _, err := c.Do(context.Background(), idem.Op{ID: fmt.Sprintf("child-%d-%d", os.Getpid(), i),
				Method: http.MethodPost, URL: "/x", Body: []byte(`{}`)}); err != nil {
				return err
			}
		}
		if os.Getenv("R4_CLOSE") == "1" {
			if err := c.Close(); err != nil {
				return err
			}
			if err := j.Close(); err != nil {
				return err
			}
		}
		fmt.Println("done")
		select {}
	}
}

// review4DeletedWALs lists this process's descriptors that name a WAL
// file that is no longer in its directory.
func review4DeletedWALs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	var out []string
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.Contains(target, "-wal") && strings.HasSuffix(target, "(deleted)") {
			out = append(out, target)
		}
	}
	return out
}

// The committer fsyncs the WAL through a descriptor it keeps; the promise
// that a Create is durable holds only while that descriptor names the live
// WAL. Two journals on one file (here in one process: a second OpenSQLite,
// as an application's second client or a CLI in the same process would
// make), the second opened and closed after the first's durable commits,
// with TRUNCATE checkpoints from a small WAL limit: no descriptor may name
// a WAL file that was deleted.
func TestReview4KeptWALDescriptorIsTheLiveWAL(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	path := filepath.Join(t.TempDir(), "j.db")
	a, err := idem.OpenSQLite(path, idem.SQLiteWALLimit(4096))
	require.NoError(t, err)
	defer a.Close()
	ca, err := idem.New(idem.Config{Journal: a, BaseURL: srv.URL})
	require.NoError(t, err)
	defer ca.Close()
	ctx := t.Context()
	do := func(c *idem.Client, id string) {
		_, err := c.Do(ctx, idem.Op{ID: id, Method: http.MethodPost, URL: "/x", Body: []byte(`{}`)})
		require.NoError(t, err)
	}
	for i := range 50 {
		do(ca, fmt.Sprintf("a-%d", i))
	}
	for round := range 3 {
		b, err := idem.OpenSQLite(path, idem.SQLiteWALLimit(4096))
		require.NoError(t, err)
		cb, err := idem.New(idem.Config{Journal: b, BaseURL: srv.URL})
		require.NoError(t, err)
		for i := range 30 {
			do(cb, fmt.Sprintf("b-%d-%d", round, i))
		}
		require.NoError(t, cb.Close())
		require.NoError(t, b.Close())
		for i := range 30 {
			do(ca, fmt.Sprintf("a-%d-%d", round, i))
		}
		assert.Empty(t, review4DeletedWALs(t), "round %d: a descriptor names a deleted WAL", round)
	}

	// The same with another process, which closes the journal or is
	// killed, while this one keeps it open; then a Do here, and a fresh
	// open reads every operation.
	for round, closeIt := range []string{"1", "0", "1"} {
		cmd := childCommand(t, "review4-writer", "R4_JOURNAL="+path, "R4_URL="+srv.URL, "R4_CLOSE="+closeIt)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		line, err := bufio.NewReader(out).ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "done\n", line)
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()
		for i := range 30 {
			do(ca, fmt.Sprintf("a-p%d-%d", round, i))
		}
		assert.Empty(t, review4DeletedWALs(t), "process round %d: a descriptor names a deleted WAL", round)
	}
}
