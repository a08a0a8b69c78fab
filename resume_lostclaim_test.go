package idem_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// lostClaimJournal commits its first Claim that takes something and
// answers it with an error, as a claim does whose acknowledgement was lost
// and could not be read back (the PostgreSQL journal's ErrCommitInDoubt).
type lostClaimJournal struct {
	idem.Journal
	lost atomic.Bool
}

func (j *lostClaimJournal) Claim(ctx context.Context, req idem.ClaimRequest) ([]idem.Record, error) {
	recs, err := j.Journal.Claim(ctx, req)
	if err == nil && len(recs) > 0 && j.lost.CompareAndSwap(false, true) {
		return nil, errors.New("commit sent, acknowledgement lost")
	}
	return recs, err
}

// TestResumeTakesUpItsOwnClaimWhoseAnswerWasLost: a Resume whose claim was
// committed but whose answer was lost leaves the operation leased to its
// own client, and no call of the client drives it. The client's next
// Resume takes it up under that lease, at once, rather than leaving it
// until the lease lapses and another worker takes it.
func TestResumeTakesUpItsOwnClaimWhoseAnswerWasLost(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"ord_1"}`))
	}))
	defer srv.Close()
	j := &lostClaimJournal{Journal: idem.NewMemoryJournal()}
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, LeaseDuration: time.Hour})
	require.NoError(t, err)
	defer c.Close()
	ctx := context.Background()
	_, err = c.Begin(ctx, idem.Op{ID: "order-1", Method: http.MethodPost, URL: "/orders", Body: []byte(`{"item":"book"}`)})
	require.NoError(t, err)

	_, err = c.Resume(ctx)
	require.Error(t, err, "the claim's answer was lost")
	rec, err := c.Lookup(ctx, "", "order-1")
	require.NoError(t, err)
	require.Equal(t, c.Owner(), rec.Lease.Owner, "the claim was committed: the operation is leased to the client")
	require.Equal(t, idem.StatePending, rec.State)

	rep, err := c.Resume(ctx)
	require.NoError(t, err)
	rec, err = c.Lookup(ctx, "", "order-1")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State, "the next Resume drove it under the client's own lease: %+v", rep)
}
