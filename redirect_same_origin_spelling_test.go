package idem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// idem follows a 307 or 308 within the request's origin, and the client
// now takes BaseURL's origin in any spelling RFC 6454 calls the same (the
// host's case, the scheme's default port written out) as its own. A
// redirect whose Location spells the same origin another way (a
// framework that writes the host as the operator configured it, in
// capitals) is on the same origin, yet it is not followed: the write,
// which the server never executed, is reported as rejected for a
// redirect "to another origin".
func TestARedirectToTheSameOriginSpelledAnotherWayIsFollowed(t *testing.T) {
	t.Parallel()
	var executed atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/orders" {
			port := r.Host[strings.LastIndex(r.Host, ":"):]
			w.Header().Set("Location", "http://LocalHost"+port+"/v2/orders")
			w.WriteHeader(http.StatusTemporaryRedirect)
			return
		}
		executed.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	base := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	c, _ := newClient(t, idem.Config{BaseURL: base, Retry: fastRetry()})
	res, err := c.Do(context.Background(), orderOp("op-1", 1))
	require.NoError(t, err, "a 307 to BaseURL's own origin, its host in capitals")
	assert.Equal(t, http.StatusCreated, res.StatusCode)
	assert.Equal(t, int32(1), executed.Load())
}
