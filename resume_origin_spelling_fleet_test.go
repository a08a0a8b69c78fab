package idem_test

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// Do now journals BaseURL's origin as BaseURL spells it, and Resume takes
// up the operations whose URL starts with its own BaseURL's spelling. Two
// holes remain on the same journal:
//
//   - a fleet's workers share it, and one worker's configuration spells
//     the API's origin another way ("http://api.example.test:80",
//     "http://API.example.test"): its Resume takes up none of the other
//     workers' operations, though they are of its origin;
//   - an operation journaled by an earlier build with Op.URL as given
//     ("http://API.example.test:80/orders"), which Do and Begin accept as
//     the same operation, is never taken up by Resume: left behind (pending
//     here, never sent; an unknown one alike).
//
// Do now journals the origin in one canonical spelling, which Resume looks
// for whatever its BaseURL's spelling, and also for its BaseURL's own
// spelling, which earlier builds journaled a relative Op.URL in. A record
// an earlier build journaled with an absolute Op.URL in a third spelling
// begins with neither, and a journal's claim is by prefix: as Resume's
// documentation says, ResumeAnyOrigin takes it up (or the next Do of it),
// which the last case holds to.
func TestResumeTakesUpItsOriginsOperationsWhateverSpellingJournaledThem(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	dial := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, srv.Listener.Addr().String()) // every name below is this server
	}}}
	journaledRecord := func(t *testing.T, j *idem.SQLiteJournal, url string) {
		op := orderOp("op-1", 1)
		_, _, err := j.Create(context.Background(), idem.Record{Key: "key-op-1", Scope: "default", ID: "op-1", Method: "POST", URL: url,
			Header: op.Header, Body: op.Body, Fingerprint: idem.Fingerprint("POST", url, op.Header, nil, op.Body),
			KeyHeader: "Idempotency-Key", State: idem.StatePending})
		require.NoError(t, err)
	}
	cases := []struct {
		name, journaled, resumer string
		opts                     []idem.ResumeOption
	}{
		{"the same spelling (the control)", "http://api.example.test/orders", "http://api.example.test", nil},
		{"another worker's BaseURL with the default port", "http://api.example.test/orders", "http://api.example.test:80", nil},
		{"another worker's BaseURL in capitals", "http://api.example.test/orders", "http://API.example.test", nil},
		{"journaled in its BaseURL's spelling by an earlier build", "http://API.example.test:80/orders", "http://API.example.test:80", nil},
		{"journaled as given by an earlier build, taken up by ResumeAnyOrigin", "http://API.example.test:80/orders", "http://api.example.test",
			[]idem.ResumeOption{idem.ResumeAnyOrigin()}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			j := openJournal(t, filepath.Join(t.TempDir(), "ops.db"))
			journaledRecord(t, j, tc.journaled)
			c, _ := newClient(t, idem.Config{Journal: j, BaseURL: tc.resumer, HTTPClient: dial, Retry: fastRetry(),
				Status: idem.ReplayStatus()})
			ctx := context.Background()
			rep, err := c.Resume(ctx, tc.opts...)
			require.NoError(t, err)
			assert.Equal(t, 1, rep.Claimed, "Resume with BaseURL %s, the operation journaled as %s: %+v", tc.resumer, tc.journaled, rep)
			rec, err := j.Lookup(ctx, "default", "op-1")
			require.NoError(t, err)
			assert.Equal(t, idem.StateSucceeded, rec.State)
		})
	}
}
