package idem_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func init() { children["std-client"] = childStandardClient }

// stdChargeBody is the form-encoded body the child posts, as a vendor SDK
// would.
const stdChargeBody = "amount=2000&currency=eur&metadata[invoice]=7"

// childStandardClient posts one charge through the standard client, as an
// SDK would (its own credentials and key on the request), for operation
// pay/invoice-7, after printing "started". The parent kills it.
func childStandardClient() error {
	j, err := idem.OpenSQLite(os.Getenv("IDEM_JOURNAL"))
	if err != nil {
		return err
	}
	c, err := idem.New(idem.Config{Journal: j, BaseURL: os.Getenv("IDEM_URL"), AttemptTimeout: time.Minute})
	if err != nil {
		return err
	}
	fmt.Println("started")
	ctx := idem.WithOperation(context.Background(), "pay/invoice-7")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, os.Getenv("IDEM_URL")+"/v1/charges", strings.NewReader(stdChargeBody))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer sdk-token")
	req.Header.Set("Idempotency-Key", "sdk-key-1")
	resp, err := c.StandardClient().Do(req)
	if err == nil {
		resp.Body.Close()
	}
	return fmt.Errorf("the request returned although the parent should have killed this process: %v", err)
}

// A process SIGKILLed while its request, sent through the standard client,
// is held by the server: after the restart, Resume sends exactly the
// journaled bytes again, under the same key, with Config.Authorize's
// credentials, and no credential ever reached the journal.
func TestStandardClientKilledMidRequestResumes(t *testing.T) {
	t.Parallel()
	type got struct {
		key, auth, contentType string
		body                   []byte
	}
	var mu sync.Mutex
	var seen []got
	arrived := make(chan struct{}, 10)
	hold := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, got{r.Header.Get("Idempotency-Key"), r.Header.Get("Authorization"), r.Header.Get("Content-Type"), body})
		held := hold
		mu.Unlock()
		arrived <- struct{}{}
		if held {
			<-r.Context().Done() // the client dies: nothing is processed
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"id":"ch_1","object":"charge"}`)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	path := filepath.Join(dir, "ops.db")

	cmd := childCommand(t, "std-client", "IDEM_JOURNAL="+path, "IDEM_URL="+srv.URL)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	require.True(t, lines.Scan(), "the child starts")
	require.Equal(t, "started", lines.Text())
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the child's request never arrived")
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_, _ = io.Copy(io.Discard, stdout)
	_ = cmd.Wait()
	mu.Lock()
	hold = false
	mu.Unlock()

	j := openJournal(t, path)
	ctx := context.Background()
	rec, err := j.Lookup(ctx, "default", "pay/invoice-7")
	require.NoError(t, err)
	assert.Equal(t, idem.StateInFlight, rec.State, "killed mid-request: in_flight, for a status check")
	c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Authorize: bearer("resume-token"), Retry: fastRetry()})
	rep, err := c.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Succeeded, "report %+v", rep)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 2, "the first send, and Resume's replay of it")
	first, again := seen[0], seen[1]
	assert.Equal(t, rec.Key, first.key, "the journaled key, not the SDK's")
	assert.Equal(t, rec.Key, again.key, "the same key after the crash")
	assert.Equal(t, stdChargeBody, string(first.body))
	assert.Equal(t, first.body, again.body, "Resume sent exactly the journaled bytes")
	assert.Equal(t, first.contentType, again.contentType)
	assert.Equal(t, "Bearer sdk-token", first.auth, "the call's own credentials")
	assert.Equal(t, "Bearer resume-token", again.auth, "after the crash, Config.Authorize's")

	res, err := c.Do(ctx, idem.Op{ID: "pay/invoice-7", URL: "/v1/charges", Body: []byte(stdChargeBody)})
	require.NoError(t, err)
	assert.True(t, res.Journaled)
	assert.Equal(t, `{"id":"ch_1","object":"charge"}`, string(res.Body))
	require.NoError(t, c.Close())
	require.NoError(t, j.Close())
	files := journalBytes(t, dir)
	assert.False(t, bytes.Contains(files, []byte("sdk-token")), "a credential reached the journal's files")
	assert.False(t, bytes.Contains(files, []byte("sdk-key-1")), "the SDK's key reached the journal's files")
}
