package idem_test

// The client against the server running as a separate OS process, on an
// SQLite key store and orders database, killed with SIGKILL in the middle
// of a request and restarted on the same files.

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testserver"
)

func init() {
	children["ordersd"] = func() error {
		var args []string
		if err := json.Unmarshal([]byte(os.Getenv("IDEM_ORDERSD_ARGS")), &args); err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		return testserver.Daemon(ctx, args, os.Stdout)
	}
}

// serverProcess is the orders service running in a child process.
type serverProcess struct {
	url  string
	cmd  *exec.Cmd
	done chan struct{}
}

func startServerProcess(t *testing.T, dir, addr string, flags ...string) *serverProcess {
	t.Helper()
	args := append([]string{"-addr", addr, "-store", filepath.Join(dir, "keys.db"),
		"-orders", filepath.Join(dir, "orders.db")}, flags...)
	enc, err := json.Marshal(args)
	require.NoError(t, err)
	cmd := childCommand(t, "ordersd", "IDEM_ORDERSD_ARGS="+string(enc))
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &serverProcess{cmd: cmd, done: make(chan struct{})}
	lines := bufio.NewScanner(stdout)
	require.True(t, lines.Scan(), "the server process printed nothing")
	p.url = strings.TrimPrefix(lines.Text(), "listening ")
	require.True(t, strings.HasPrefix(p.url, "http://"), lines.Text())
	go func() {
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	return p
}

func (p *serverProcess) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// countRows counts a table's rows in one of the server's SQLite files.
func countRows(t *testing.T, path, table string) int {
	t.Helper()
	db, err := sql.Open("sqlite3", path)
	require.NoError(t, err)
	defer db.Close()
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+table).Scan(&n))
	return n
}

func TestAcceptanceServerKilledMidRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills server processes")
	}
	t.Parallel()
	for _, c := range []struct {
		name string
		hold string
		// held reports that the server is holding the request at the
		// point the test means to kill it.
		held func(t *testing.T, dir string) bool
	}{
		{"after the key was claimed, before the order", "-delay-before",
			func(t *testing.T, dir string) bool {
				return countRows(t, filepath.Join(dir, "keys.db"), "entries") == 1
			}},
		{"after the order was committed, before the answer was stored", "-delay-after",
			func(t *testing.T, dir string) bool {
				return countRows(t, filepath.Join(dir, "orders.db"), "orders") == 1
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			srv := startServerProcess(t, dir, "127.0.0.1:0", c.hold, "30s", "-lock-timeout", "300ms")
			u, err := url.Parse(srv.url)
			require.NoError(t, err)
			policy := idem.RetryPolicy{MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
				MaxAttempts: 3, MaxStatusChecks: 3}
			client, j := newClient(t, idem.Config{BaseURL: srv.url, Status: idem.StatusEndpoint(srv.url + "/idempotency"),
				Retry: policy, AttemptTimeout: 60 * time.Second})
			ctx := context.Background()

			first := make(chan error, 1)
			go func() {
				_, err := client.Do(ctx, orderOp("checkout/cart-crash", 1))
				first <- err
			}()
			require.Eventually(t, func() bool { return c.held(t, dir) }, 20*time.Second, 5*time.Millisecond,
				"the server must be holding the request")
			srv.kill()
			err = <-first
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "the request was written and no answer came")
			rec, err := j.Lookup(ctx, "default", "checkout/cart-crash")
			require.NoError(t, err)
			assert.Equal(t, idem.StateUnknown, rec.State)

			// The server restarts on the same files and the same address.
			startServerProcess(t, dir, u.Host, "-lock-timeout", "300ms")
			policy.MaxStatusChecks = 100 // the dead handler's lock takes 300 ms to go stale
			client2, err := idem.New(idem.Config{Journal: j, BaseURL: srv.url,
				Status: idem.StatusEndpoint(srv.url + "/idempotency"), Retry: policy})
			require.NoError(t, err)
			defer client2.Close()
			res, err := client2.Do(ctx, orderOp("checkout/cart-crash", 1))
			require.NoError(t, err)
			assert.Equal(t, rec.Key, res.Key, "the same key after the crash")
			assert.Equal(t, "ord_1", orderID(t, res.Body))
			assert.Equal(t, 1, countRows(t, filepath.Join(dir, "orders.db"), "orders"), "exactly one order")
		})
	}
}
