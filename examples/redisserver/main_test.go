package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two replicas of the API on one Redis: a request retried on the other
// replica is replayed from the key the first one stored.
func TestTwoReplicasShareTheirKeys(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: *redisAddr})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Skipf("no Redis answers at %s (%v): start one with redis-server --port 6379 --save '' --appendonly no", *redisAddr, err)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	*prefix = "idemtest:" + hex.EncodeToString(b[:]) + ":"
	defer func() {
		keys, _ := c.Keys(context.Background(), *prefix+"*").Result()
		if len(keys) > 0 {
			c.Del(context.Background(), keys...)
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var bases []string
	var dones []chan error
	for range 2 {
		*addr = "127.0.0.1:0"
		*dataDir = t.TempDir()
		ready := make(chan string, 1)
		listening = func(a string) { ready <- a }
		done := make(chan error, 1)
		go func() { done <- run(ctx) }()
		select {
		case a := <-ready:
			bases = append(bases, "http://"+a)
		case err := <-done:
			t.Fatalf("run returned before listening: %v", err)
		}
		dones = append(dones, done)
	}

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	send := func(base string) (int, http.Header, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/orders", strings.NewReader(`{"item":"book","quantity":2}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "9f1c2a4e-3b7d-4c8e-a1f0-5d6e7b8c9a0b")
		req.Header.Set("X-Tenant", "acme")
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header, string(body)
	}
	code, h, first := send(bases[0])
	assert.Equal(t, http.StatusCreated, code)
	assert.Empty(t, h.Get("Idempotent-Replayed"))
	code, h, again := send(bases[1])
	assert.Equal(t, http.StatusCreated, code)
	assert.Equal(t, "true", h.Get("Idempotent-Replayed"), "the other replica replays the stored response")
	assert.Equal(t, first, again)

	cancel()
	for _, done := range dones {
		require.NoError(t, <-done, "run shuts down cleanly when its context ends")
	}
}
