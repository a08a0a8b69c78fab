package webui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/operator"
)

// On a hot standby the journal cannot tell which workers are alive: the
// overview says so (what idem ui's Alive returns there, see cmd/idem's
// journal.go) and shows the workers by their leases, not as gone. Any
// other failure of Alive still fails the page.
func TestOverviewSaysLivenessIsUnknownOnAStandby(t *testing.T) {
	t.Parallel()
	path, keys := fixtureJournal(t)
	j := openJournal(t, path)
	leased := false
	for _, key := range keys {
		if _, err := j.Acquire(context.Background(), key, "worker-a", time.Hour); err == nil {
			leased = true
			break
		}
	}
	require.True(t, leased, "the fixture has an operation worker-a can lease")
	srv, c := server(t, Config{Journal: j, Path: path,
		Alive: func(context.Context) (map[string]bool, error) {
			return nil, fmt.Errorf("%w (listing owners: on a standby)", operator.ErrLivenessUnknown)
		}})
	a := get(t, c, srv.URL+"/")
	assert.Equal(t, http.StatusOK, a.code, a.body)
	assert.Contains(t, a.body, `<p id="liveness-unknown" class="muted">liveness unknown on a standby: run this against the primary; the statuses below are the leases'</p>`)
	assert.Regexp(t, `<td>worker-a</td><td class="worker-holding">holding</td>`, a.body)
	assert.NotContains(t, a.body, `worker-gone`)
	assert.NotContains(t, a.body, `worker-alive`)

	srv, c = server(t, Config{Journal: j, Path: path,
		Alive: func(context.Context) (map[string]bool, error) { return nil, errors.New("connection refused") }})
	a = get(t, c, srv.URL+"/")
	assert.Equal(t, http.StatusInternalServerError, a.code)
	assert.NotContains(t, a.body, "liveness-unknown")
}
