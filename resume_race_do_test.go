package idem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestResumeLeavesAloneTheOperationADoOfItsClientJustCreated: a Resume
// of the client that runs while a Do of it has journaled its intent but
// not yet taken it up (between the create's commit and the driver) finds
// the operation under the client's own lease and held by no call. It must
// leave it to that Do: taking it up, finding the Do's flight and
// releasing the lease would release the very lease the Do sends under.
// The OnTransition hook of the create runs in that gap; it runs the
// Resume there.
func TestResumeLeavesAloneTheOperationADoOfItsClientJustCreated(t *testing.T) {
	var sent atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"ord_1"}`))
	}))
	defer srv.Close()
	ctx := context.Background()
	var c *idem.Client
	var resumed atomic.Bool
	var rep idem.ResumeReport
	var resumeErr error
	c, err := idem.New(idem.Config{Journal: idem.NewMemoryJournal(), BaseURL: srv.URL, LeaseDuration: time.Hour,
		OnTransition: func(tr idem.Transition) {
			if tr.Kind == idem.EventCreate && resumed.CompareAndSwap(false, true) {
				rep, resumeErr = c.Resume(ctx)
			}
		}})
	require.NoError(t, err)
	defer c.Close()

	res, err := c.Do(ctx, idem.Op{ID: "order-1", Method: http.MethodPost, URL: "/orders", Body: []byte(`{"item":"book"}`)})
	require.True(t, resumed.Load(), "the hook ran a Resume")
	require.NoError(t, resumeErr)
	require.NoError(t, err, "the Do drove its own operation; the Resume reported %+v", rep)
	assert.Equal(t, idem.StateSucceeded, res.State)
	assert.EqualValues(t, 1, sent.Load())
	rec, err := c.Lookup(ctx, "", "order-1")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
}
