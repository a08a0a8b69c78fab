package main

import (
	"bytes"
	"context"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// resumeArgs are the flags of a resume run against api, whose token is in
// $IDEM_TEST_TOKEN.
func resumeArgs(path string, api *apiServer, more ...string) []string {
	return append([]string{"--journal", path, "resume", "--replay", "--base-url", api.URL,
		"--header-env", "X-Api-Token=IDEM_TEST_TOKEN"}, more...)
}

// holdLease leases the operation to a live owner of this process, as a
// running application holds the operations it drives.
func holdLease(t *testing.T, j *idem.SQLiteJournal, key string) idem.Record {
	t.Helper()
	owner := "pod-9#" + newKey()[:8]
	unregister, err := j.Register(context.Background(), owner)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unregister() })
	rec, err := j.Acquire(context.Background(), key, owner, time.Hour)
	require.NoError(t, err)
	return rec
}

// The summary says what a run left alone in its scope, and why: leased by
// a live process, or not due yet (and when the next one is).
func TestResumeSaysWhatItLeftAlone(t *testing.T) {
	t.Parallel()
	api := newAPIServer(t, "X-Api-Token", "secret")
	path, j := openTestJournal(t)
	defer j.Close()
	due := put(t, j, op{id: "due", url: api.URL + "/orders", body: []byte(`{}`)})
	held := holdLease(t, j, put(t, j, op{id: "held", url: api.URL + "/orders", body: []byte(`{}`)}).Key)
	nextDue := time.Now().Add(time.Hour)
	later := put(t, j, op{id: "later", url: api.URL + "/orders", body: []byte(`{}`), due: nextDue})
	laterStill := put(t, j, op{id: "later-still", url: api.URL + "/orders", body: []byte(`{}`), due: nextDue.Add(time.Hour)})

	r := cli(t, "", []string{"IDEM_TEST_TOKEN=secret"}, resumeArgs(path, api)...)
	require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	t.Logf("idem resume:\n%s", r.stdout)
	assert.Equal(t, map[string]int{"claimed": 1, "succeeded": 1, "skipped": 3, "leased": 1, "not_due": 2}, nonZero(summary(t, r.stdout)))
	assert.Regexp(t, `; left alone: busy 0, leased by a live owner 1, not due 2 \(the next due at `+
		later.NextAttemptAt.UTC().Format("2006-01-02 15:04:05.000Z")+`, in 59m\d\ds\)\n`, r.stdout)
	assert.Contains(t, r.stdout, "\njournal: 3 operation(s) unsettled")

	assert.Equal(t, idem.StateSucceeded, getRecord(t, path, due.Key).State)
	for _, rec := range []idem.Record{held, later, laterStill} {
		assert.Equal(t, rec, getRecord(t, path, rec.Key), "left alone: %s", rec.ID)
	}
}

// --wait waits for what one pass leaves alone: here an operation that a
// live process was driving, and that it left due a little later. Without
// --wait the same run leaves it pending.
func TestResumeWait(t *testing.T) {
	t.Parallel()
	for _, wait := range []bool{false, true} {
		name := "one pass"
		if wait {
			name = "--wait"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			api := newAPIServer(t, "X-Api-Token", "secret")
			path, j := openTestJournal(t)
			defer j.Close()
			first := put(t, j, op{id: "first", url: api.URL + "/orders", body: []byte(`{}`)})
			held := holdLease(t, j, put(t, j, op{id: "held", url: api.URL + "/orders", body: []byte(`{}`)}).Key)

			// While the run sends the first operation, the process that held
			// the other one stops, leaving it due a little later: after the
			// run's pass began, so the pass never takes it up.
			arrived, goOn := make(chan struct{}), make(chan struct{})
			api.mu.Lock()
			api.before = func(r *http.Request) {
				if r.Header.Get("Idempotency-Key") == first.Key {
					close(arrived)
					<-goOn
				}
			}
			api.mu.Unlock()
			args := resumeArgs(path, api, "--timeout", "1m")
			if wait {
				args = append(args, "--wait")
			}
			cmd := exec.Command(idemBin, args...)
			cmd.Env = append(childEnv(), "IDEM_TEST_TOKEN=secret")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			require.NoError(t, cmd.Start())
			<-arrived
			next := held
			next.NextAttemptAt = time.Now().Add(100 * time.Millisecond)
			next, err := j.Update(context.Background(), next, idem.Durable, idem.Event{Kind: idem.EventStop, Detail: "due again soon"})
			require.NoError(t, err)
			require.NoError(t, j.Release(context.Background(), held.Key, held.Lease))
			close(goOn)
			err = cmd.Wait()
			require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			assert.Empty(t, stderr.String())

			got := summary(t, stdout.String())
			assert.Equal(t, idem.StateSucceeded, getRecord(t, path, first.Key).State)
			if !wait {
				assert.Equal(t, 1, got["claimed"])
				rec := getRecord(t, path, held.Key)
				assert.Equal(t, idem.StatePending, rec.State)
				assert.Equal(t, next.Version, rec.Version, "untouched since its holder left it")
				return
			}
			assert.Equal(t, map[string]int{"claimed": 2, "succeeded": 2}, nonZero(got))
			assert.Equal(t, idem.StateSucceeded, getRecord(t, path, held.Key).State)
		})
	}
}

// --timeout bounds --wait: what is not due in time stays journaled, and
// the run ends with exit status 3.
func TestResumeWaitTimeout(t *testing.T) {
	t.Parallel()
	api := newAPIServer(t, "X-Api-Token", "secret")
	path, j := openTestJournal(t)
	later := put(t, j, op{id: "later", url: api.URL + "/orders", body: []byte(`{}`), due: time.Now().Add(time.Hour)})
	require.NoError(t, j.Close())

	r := cli(t, "", []string{"IDEM_TEST_TOKEN=secret"}, resumeArgs(path, api, "--wait", "--timeout", "1s")...)
	require.Equal(t, 3, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	assert.Equal(t, "idem: resume stopped by --timeout before it finished; unsettled operations stay journaled for the next run\n", r.stderr)
	assert.Equal(t, map[string]int{"skipped": 1, "not_due": 1}, nonZero(summary(t, r.stdout)))
	assert.Equal(t, later, getRecord(t, path, later.Key))
}
