package server_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

// A child process of this test binary serves the middleware on the SQLite
// store at IDEM_SERVER_STORE when IDEM_SERVER_CHILD is "serve" (run from
// init, before the tests' TestMain): it prints its URL, appends each key
// its handler runs to IDEM_SERVER_RUNS, and exits when its stdin closes.
func init() {
	if os.Getenv("IDEM_SERVER_CHILD") != "serve" {
		return
	}
	if err := serveChild(); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serveChild() error {
	store, err := server.OpenSQLiteStore(os.Getenv("IDEM_SERVER_STORE"))
	if err != nil {
		return err
	}
	defer store.Close()
	runs, err := os.OpenFile(os.Getenv("IDEM_SERVER_RUNS"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer runs.Close()
	mw, err := server.New(server.Config{Store: store, Scope: server.SingleTenant})
	if err != nil {
		return err
	}
	defer mw.Close()
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// One write(2) per run, appended: the runs of both processes
		// interleave whole.
		if _, err := runs.WriteString(r.Header.Get("Idempotency-Key") + "\n"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		time.Sleep(20 * time.Millisecond) // so that other requests for the key overlap the run
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"order":"`+r.Header.Get("Idempotency-Key")+`"}`)
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	fmt.Println("http://" + ln.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return srv.Close()
}

// startServeChild starts a server process on the store at path and returns
// a function that waits for its URL; it ends when the test does.
func startServeChild(t *testing.T, path, runs string) func() string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "IDEM_SERVER_CHILD=serve", "IDEM_SERVER_STORE="+path, "IDEM_SERVER_RUNS="+runs)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = stdin.Close()
		assert.NoError(t, cmd.Wait(), "the server process ended cleanly")
	})
	return func() string {
		lines := bufio.NewScanner(stdout)
		require.True(t, lines.Scan(), "the server process prints its URL")
		return lines.Text()
	}
}

// Two server processes on one SQLite store file, as two replicas of an API
// on one machine, started together so that both create the file: the
// requests for each key, sent to both at once, run the handler once, and
// every answer is the one run's response or 409 (in progress), never a
// second run and never a 5xx.
func TestTwoServerProcessesOnOneSQLiteStoreRunEachKeyOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path, runs := filepath.Join(dir, "keys.db"), filepath.Join(dir, "runs")
	a, b := startServeChild(t, path, runs), startServeChild(t, path, runs)
	urls := []string{a(), b()}

	const keys, perKey = 30, 8
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: keys * perKey}}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for k := range keys {
		key := fmt.Sprintf("key-%d", k)
		for i := range perKey {
			wg.Go(func() {
				req, err := http.NewRequest(http.MethodPost, urls[i%2]+"/orders", strings.NewReader(`{"item":"book"}`))
				if !assert.NoError(t, err) {
					return
				}
				req.Header.Set("Idempotency-Key", key)
				resp, err := client.Do(req)
				if !assert.NoError(t, err) {
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				mu.Lock()
				codes[resp.StatusCode]++
				mu.Unlock()
				switch resp.StatusCode {
				case http.StatusCreated:
					assert.Equal(t, `{"order":"`+key+`"}`, string(body))
				case http.StatusConflict:
				default:
					t.Errorf("key %s: %d %s", key, resp.StatusCode, body)
				}
			})
		}
	}
	wg.Wait()
	out, err := os.ReadFile(runs)
	require.NoError(t, err)
	ran := map[string]int{}
	for _, k := range strings.Fields(string(out)) {
		ran[k]++
	}
	assert.Len(t, ran, keys, "every key ran")
	for k, n := range ran {
		assert.Equal(t, 1, n, "the handler ran %d times for %s across the two processes", n, k)
	}
	t.Logf("answers: %v", codes)
}
