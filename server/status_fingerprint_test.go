package server_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/wire"
)

// A status answer carries the fingerprint of the request the key is
// stored for (the one the middleware compares a retry's with), while it is
// processed and once completed, so that a client can tell another
// request's answer under its key from its own; not_found has none.
func TestStatusAnswerCarriesTheStoredRequestsFingerprint(t *testing.T) {
	t.Parallel()
	g := newGate()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) { g.wait(); created(w, r) })
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.post("/orders?src=web", "k", `{"item":"book"}`)
	}()
	g.waitEntered(t)
	want := wire.RequestFingerprint(http.MethodPost, "/orders?src=web", []byte(`{"item":"book"}`))
	s, _, _ := e.status("k")
	assert.Equal(t, wire.StateProcessing, s.State)
	assert.Equal(t, want, s.Fingerprint, "processing")
	g.release()
	<-done

	s, _, _ = e.status("k")
	require.Equal(t, wire.StateCompleted, s.State)
	assert.Equal(t, want, s.Fingerprint, "completed")
	// The same digest the middleware compares: another body under the key
	// is refused, and the answer still carries the first request's.
	assert.Equal(t, http.StatusUnprocessableEntity, e.post("/orders?src=web", "k", `{"item":"piano"}`).Status)
	s, _, _ = e.status("k")
	assert.Equal(t, want, s.Fingerprint)

	s, _, _ = e.status("never-seen")
	assert.Equal(t, wire.StateNotFound, s.State)
	assert.Empty(t, s.Fingerprint)
}
