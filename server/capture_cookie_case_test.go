package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSetCookieUnderANonCanonicalNameIsNeverStored: "Set-Cookie goes to
// the first caller only and is never stored". net/http sends a header
// written under a non-canonical name (w.Header()["set-cookie"], as code
// that fills the map directly does) as it is, and header names are
// case-insensitive, so that is a Set-Cookie to the client. The capture strips only the
// canonical "Set-Cookie" key: the session cookie is stored, replayed to
// every later caller with the key, and shown by the status endpoint.
func TestSetCookieUnderANonCanonicalNameIsNeverStored(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header()["set-cookie"] = []string{"session=s3cr3t; HttpOnly"}
		w.WriteHeader(http.StatusCreated)
	})
	first := e.post("/orders", "k1", `{}`)
	require.Equal(t, http.StatusCreated, first.Status)
	assert.Equal(t, "session=s3cr3t; HttpOnly", first.Header.Get("Set-Cookie"), "the first caller gets its cookie")

	replay := e.post("/orders", "k1", `{}`)
	require.True(t, replay.replayed())
	assert.Empty(t, replay.Header.Values("Set-Cookie"), "the replay carries no cookie")

	s, body, _ := e.status("k1")
	require.NotNil(t, s.Response)
	for name := range s.Response.Header {
		assert.NotEqual(t, "set-cookie", strings.ToLower(name), "the stored response holds no cookie: %s", body)
	}
	assert.EqualValues(t, 1, e.calls.Load())
}
