package idem_test

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// Resume takes up the operations whose URL starts with BaseURL's origin,
// built from the parsed host (url.URL.Host, decoded), while Do journals
// the URL as url.URL.String gives it, the host percent-encoded. A host
// that needs encoding is never taken up by the client that sent it; its
// outcome unknown, the operation is left behind for good (background
// resume included):
//
//   - an IPv6 link-local address names its zone, "%25" in the URL (RFC
//     6874): Resume looks for "[fe80::1%eth0]", the journal holds
//     "[fe80::1%25eth0]";
//   - an internationalized host name given in Unicode: Resume looks for
//     "bücher.example.test", the journal holds "b%C3%BCcher.example.test".
func TestResumeTakesUpAnOperationOfABaseURLWhoseHostIsEncoded(t *testing.T) {
	t.Parallel()
	for _, base := range []string{"http://[fe80::1%25eth0]:8080", "http://bücher.example.test"} {
		t.Run(base, func(t *testing.T) {
			t.Parallel()
			var lose atomic.Bool
			lose.Store(true)
			srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				if lose.Load() {
					dropConn(w) // applied, the answer lost: unknown
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			dial := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", srv.Listener.Addr().String()) // the host below is this server
			}}}
			c, j := newClient(t, idem.Config{BaseURL: base, HTTPClient: dial, Retry: fastRetry(),
				Journal: openJournal(t, filepath.Join(t.TempDir(), "ops.db"))})
			ctx := context.Background()
			_, err := c.Do(ctx, orderOp("op-1", 1))
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			lose.Store(false)
			rep, err := c.Resume(ctx, idem.ResumeWait())
			require.NoError(t, err)
			rec, err := j.Lookup(ctx, "default", "op-1")
			require.NoError(t, err)
			assert.Equal(t, 1, rep.Claimed, "Resume of the client that sent it, the operation journaled as %s: %+v", rec.URL, rep)
			assert.Equal(t, idem.StateSucceeded, rec.State)
		})
	}
}
