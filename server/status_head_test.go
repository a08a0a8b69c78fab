package server_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStatusEndpointAnswersHEADAsItAnswersGET: the documented mount,
// "GET /idempotency/{key}", is a ServeMux pattern that routes HEAD to the
// handler as well, because a resource that answers GET answers HEAD (RFC
// 9110 §9.3.2: the same status and header fields, without the body). A
// monitor or a proxy probing the endpoint with HEAD gets 405 with
// "Allow: GET" instead: a route the mux says serves HEAD refuses it, and
// its Allow leaves HEAD out.
func TestStatusEndpointAnswersHEADAsItAnswersGET(t *testing.T) {
	t.Parallel()
	e := newEnv(t, created)
	require.Equal(t, http.StatusCreated, e.post("/orders", "k1", `{}`).Status)

	for key, want := range map[string]int{"k1": http.StatusOK, "absent": http.StatusNotFound} {
		get := e.do(http.MethodGet, "/idempotency/"+key, "")
		head := e.do(http.MethodHead, "/idempotency/"+key, "")
		require.Equal(t, want, get.Status, key)
		assert.Equal(t, get.Status, head.Status, "%s: HEAD answers with GET's status", key)
		assert.Equal(t, get.Header.Get("Content-Type"), head.Header.Get("Content-Type"), "%s: and its header fields", key)
		assert.Empty(t, head.Body, "%s: without a body", key)
	}
}
