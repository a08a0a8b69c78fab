package idem_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// An answer longer than Config.MaxResponseBytes is cut and the operation
// settled; Do's caller can compare lengths, but a response from the
// standard client is read by an SDK that knows nothing of idem. By
// net/http's conventions a body that ends before the answer does is a read
// error (io.ErrUnexpectedEOF), never a clean EOF: here the SDK reads the
// first kilobyte of a 64 KiB answer, without an error and without a
// Content-Length to compare with, and takes the cut body for the whole
// answer (a JSON decoder then fails, and the SDK reports a write that was
// applied as failed).
func TestStandardClientCutBodyIsNotACompleteBody(t *testing.T) {
	t.Parallel()
	answer := `{"items":"` + strings.Repeat("x", 64<<10) + `"}`
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, answer)
	})
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), MaxResponseBytes: 1 << 10})
	ctx, cancel := context.WithTimeout(idem.WithOperation(context.Background(), "op-1"), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"n":1}`))
	require.NoError(t, err)
	resp, err := c.StandardClient().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil {
		assert.Equal(t, len(answer), len(body), "a cut body read to a clean EOF, Content-Length %q", resp.Header.Get("Content-Length"))
	}
}
