package idem_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// errAnswerLost is the error of a journal write that committed and whose
// answer never came back.
var errAnswerLost = errors.New("the journal's answer was lost after its commit")

// lostAnswer is a real journal whose next Create, once armed, commits and
// then reports errAnswerLost, as a database connection cut after the
// COMMIT does: the record is journaled, leased to the client, and the Do
// that created it returns.
type lostAnswer struct {
	idem.Journal
	armed atomic.Bool
}

func (j *lostAnswer) Create(ctx context.Context, rec idem.Record) (idem.Record, bool, error) {
	stored, created, err := j.Journal.Create(ctx, rec)
	if err == nil && j.armed.CompareAndSwap(true, false) {
		return idem.Record{}, false, errAnswerLost
	}
	return stored, created, err
}

// leaveALeaseBehind makes a Do of op on c whose create loses its answer: the
// operation stays journaled in_flight under c's own lease, which no call of
// c holds any more. Nothing is sent.
func leaveALeaseBehind(t *testing.T, c *idem.Client, j *lostAnswer, op idem.Op) {
	t.Helper()
	j.armed.Store(true)
	_, err := c.Do(context.Background(), op)
	require.ErrorIs(t, err, errAnswerLost)
	rec, err := j.Lookup(context.Background(), "default", op.ID)
	require.NoError(t, err)
	require.Equal(t, idem.StateInFlight, rec.State)
	require.Equal(t, c.Owner(), rec.Lease.Owner, "the lease is the client's own")
	require.True(t, rec.Lease.Held(time.Now()))
}

// Resume takes up an operation under the client's own lease that a call of
// this client left behind, as the next Do would, instead of leaving it
// until the lease lapses (an hour here).
func TestResumeTakesUpALeaseThisClientLeftBehind(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	j := &lostAnswer{Journal: openJournal(t, t.TempDir()+"/ops.db")}
	c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Retry: fastRetry(), LeaseDuration: time.Hour})
	op := idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)}
	leaveALeaseBehind(t, c, j, op)
	assert.Empty(t, srv.received(), "nothing was sent")

	rep, err := c.Resume(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Claimed, "Resume took up the operation left behind: %+v", rep)
	assert.Equal(t, 1, rep.Succeeded, "%+v", rep)
	assert.Len(t, srv.received(), 1)
	rec, err := j.Lookup(context.Background(), "default", op.ID)
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
}

// A Do that takes up the client's own lease left behind by an earlier call
// waits for a server that says "processing" as any Do does: until the
// caller's deadline, not RetryPolicy.MaxStatusChecks.
func TestTheCallersDeadlineGovernsTheWaitUnderALeaseLeftBehind(t *testing.T) {
	t.Parallel()
	srv, checks := processingAPI(t)
	j := &lostAnswer{Journal: openJournal(t, t.TempDir()+"/ops.db")}
	policy := idem.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, MaxAttempts: 1, MaxStatusChecks: 2,
		Budget: 50 * time.Millisecond}
	c, _ := newClient(t, idem.Config{Journal: j, BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/idempotency"), Retry: policy,
		LeaseDuration: time.Hour})
	op := idem.Op{ID: "order-1", URL: "/orders", Body: []byte(`{}`)}
	leaveALeaseBehind(t, c, j, op)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := c.Do(ctx, op)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	assert.Greater(t, checks.Load(), int32(policy.MaxStatusChecks), "the checks stopped at RetryPolicy.MaxStatusChecks under a deadline: %v", err)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "the error names the deadline as what ended the wait")
	assert.NotContains(t, err.Error(), "MaxStatusChecks")
}
