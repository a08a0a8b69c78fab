package idem_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// passThrough is the commonest RoundTripper an application wraps its
// transport in (logging, metrics, a header added): it hands the request,
// its context and so its trace, to net/http's own transport unchanged.
type passThrough struct{ base http.RoundTripper }

func (t passThrough) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.base.RoundTrip(req)
}

// The caller's context ends after Do journaled the operation and before
// the transport took a connection: net/http's transport returns the
// context's error before it gets a connection, and nothing is written.
// With net/http's transport itself Do says so (ErrNotSent, pending, and
// Cancel withdraws it). With the same transport behind a pass-through
// wrapper, the trace saw nothing (no GetConn, which net/http calls only
// once it goes for a connection), and the attempt now counts as possibly
// written: unknown, a retention clock, and Cancel refused, for a request
// that never left the process.
func TestAnAttemptEndedBeforeAnyConnectionThroughAWrapperIsNotSent(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	for name, transport := range map[string]http.RoundTripper{
		"net/http's transport (the control)": &http.Transport{},
		"a pass-through wrapper":             passThrough{&http.Transport{}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), HTTPClient: &http.Client{Transport: transport},
				// The caller gives up while the attempt is being prepared.
				Authorize: func(*http.Request) error { cancel(); return nil }})
			_, err := c.Do(ctx, orderOp("op-1", 1))
			require.Error(t, err)
			assert.Empty(t, srv.received(), "nothing reached the server")
			assert.ErrorIs(t, err, idem.ErrNotSent, "nothing was written")
			rec, lerr := c.Lookup(context.Background(), "default", "op-1")
			require.NoError(t, lerr)
			assert.Equal(t, idem.StatePending, rec.State, "LastError: %s", rec.LastError)
		})
	}
}
