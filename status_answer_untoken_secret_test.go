package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestStatusAnswerSecretNameThatIsNoTokenIsNeverJournaled: a status
// endpoint's JSON may name a header in a spelling net/http would never
// produce from the wire, such as "x-secret-token " with a trailing blank.
// CanonicalHeaderKey leaves a name that is not a token as it is, so
// dropSecrets neither matches it to Config.SecretHeaders nor merges it:
// the secret is journaled in clear and returned in Result.Header.
func TestStatusAnswerSecretNameThatIsNoTokenIsNeverJournaled(t *testing.T) {
	t.Parallel()
	const secret = "st_0a1b2c3d4e5f6a7b"
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet { // the status endpoint
			w.WriteHeader(http.StatusOK)
			fmt.Fprintf(w, `{"key":%q,"state":"completed","response":{"status":201,"header":{"x-secret-token ":["%s"]},"body":"{}"}}`,
				r.PathValue("key"), secret)
			return
		}
		dropConn(w) // the attempt's answer is lost: the client asks the status endpoint
	})
	srv.routeStatus()
	c, j := newClient(t, idem.Config{
		BaseURL:       srv.URL,
		Status:        idem.StatusEndpoint(srv.URL + "/status"),
		Retry:         fastRetry(),
		SecretHeaders: []string{"X-Secret-Token"},
	})
	res, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders"})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	for name, v := range res.Header {
		assert.NotContains(t, strings.Join(v, ","), secret, "Result.Header[%q] carries the secret", name)
	}
	require.NoError(t, j.Close())
	assertJournalHoldsNo(t, j, secret)
}
