package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// Hooks promise that what they are given "holds no body, no header value
// and no credential", and Config.Logger's documentation lists Hooks among
// the places a URL appears without its query and userinfo, "which may
// carry a token". An operation whose URL carries ?api_key=… must not hand
// the token to CallStart, Attempt, StatusCheck or CallEnd, which feed
// traces and metrics (the journaled request keeps it: it is sent again).
func TestHooksCarryNoQueryStringToken(t *testing.T) {
	t.Parallel()
	const token = "qk_live_hooks_5e4d3c2b1a"
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		dropConn(w) // the attempt's answer and every replay's are lost
	})
	var (
		mu   sync.Mutex
		seen []string
	)
	note := func(what string, v any) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%s: %+v", what, v))
	}
	c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(), Hooks: idem.Hooks{
		CallStart: func(ctx context.Context, call idem.Call) context.Context {
			note("CallStart", call)
			return ctx
		},
		CallEnd: func(_ context.Context, call idem.Call, end idem.CallEnd) {
			note("CallEnd", call)
			note("CallEnd.end", end)
		},
		Attempt:     func(_ context.Context, a idem.AttemptInfo) { note("Attempt", a) },
		StatusCheck: func(_ context.Context, s idem.StatusCheckInfo) { note("StatusCheck", s) },
	}})
	_, err := c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders?api_key=" + token})
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	assert.NotContains(t, err.Error(), token, "Do's error")
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, seen)
	leaked := 0
	for _, s := range seen {
		if strings.Contains(s, token) {
			leaked++
			if leaked <= 3 {
				t.Errorf("a hook was given the URL's query token: %.300s", s)
			}
		}
	}
	assert.Zero(t, leaked, "of %d hook calls, %d carried the token", len(seen), leaked)
}
