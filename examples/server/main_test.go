package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestRun(t *testing.T) {
	*addr = "127.0.0.1:0"
	*dataDir = t.TempDir()
	ready := make(chan string, 1)
	listening = func(a string) { ready <- a }

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var base string
	select {
	case a := <-ready:
		base = "http://" + a
	case err := <-done:
		t.Fatalf("run returned before listening: %v", err)
	}

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	send := func(method, path string) (int, http.Header, string) {
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader(`{"item":"book","quantity":2}`)
		}
		req, err := http.NewRequestWithContext(ctx, method, base+path, body)
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "9f1c2a4e-3b7d-4c8e-a1f0-5d6e7b8c9a0b")
		req.Header.Set("X-Tenant", "acme")
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header, string(b)
	}

	code, h, first := send(http.MethodPost, "/orders")
	assert.Equal(t, http.StatusCreated, code)
	assert.Equal(t, `{"order_id":"ord_1","item":"book","quantity":2}`, first)
	assert.Empty(t, h.Get("Idempotent-Replayed"))

	code, h, replay := send(http.MethodPost, "/orders")
	assert.Equal(t, http.StatusCreated, code)
	assert.Equal(t, "true", h.Get("Idempotent-Replayed"))
	assert.Equal(t, first, replay)

	code, _, body := send(http.MethodGet, "/idempotency/9f1c2a4e-3b7d-4c8e-a1f0-5d6e7b8c9a0b")
	assert.Equal(t, http.StatusOK, code)
	s := decodeStatus(t, body)
	assert.Equal(t, "completed", s.State)
	require.NotNil(t, s.Response)
	assert.Equal(t, first, s.Response.Body)

	cancel()
	require.NoError(t, <-done, "run shuts down cleanly when its context ends")
}

// status is the status endpoint's answer, as much of it as the tests read.
type status struct {
	Key      string `json:"key"`
	State    string `json:"state"`
	Response *struct {
		Status int    `json:"status"`
		Body   string `json:"body"`
	} `json:"response"`
}

func decodeStatus(t *testing.T, body string) status {
	t.Helper()
	var s status
	require.NoError(t, json.Unmarshal([]byte(body), &s), "the status answer is JSON: %s", body)
	return s
}

// run must stop every goroutine it starts (servers, clients, journals).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
