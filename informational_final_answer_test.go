package idem_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A 1xx is never a final answer to a request (RFC 9110 §15.2), and a 101
// Switching Protocols is one only to a request that asked to upgrade,
// which a write never does. net/http hands a 101 back as the response
// because the connection now speaks another protocol, not because the
// server answered the write: the server received the write and may have
// applied it. Such an answer is no definitive refusal: the outcome is
// unknown, and the status check (here: completed, 201) must settle it,
// not a report that the server rejected the operation.
func TestA101ToAWriteIsNoRejection(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	var writes atomic.Int32
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				for {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, r.Body)
					if r.Method == http.MethodGet {
						key := strings.TrimPrefix(r.URL.Path, "/idempotency/")
						body := fmt.Sprintf(`{"key":%q,"state":"completed","response":{"status":201,"body":"{\"order_id\":\"o-1\"}"}}`, key)
						fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
						continue
					}
					// The write is received (and applied); the answer is a
					// protocol switch nobody asked for.
					writes.Add(1)
					_, _ = io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
					return
				}
			}()
		}
	}()
	base := "http://" + ln.Addr().String()
	c, _ := newClient(t, idem.Config{BaseURL: base, Status: idem.StatusEndpoint(base + "/idempotency"), Retry: fastRetry()})
	res, err := c.Do(context.Background(), orderOp("op-1", 1))
	assert.Equal(t, int32(1), writes.Load())
	assert.NotErrorIs(t, err, idem.ErrRejected, "a 101 to a write was reported as the server's refusal")
	if res != nil {
		assert.NotEqual(t, http.StatusSwitchingProtocols, res.StatusCode, "a 101 journaled as the operation's answer")
	}
}
