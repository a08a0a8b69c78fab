package redis_test

import (
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// dropProxy forwards a Redis connection both ways and, once armed, closes
// it instead of forwarding the next reply: a command that ran, whose answer
// is lost.
type dropProxy struct {
	addr  string
	armed atomic.Bool
}

func newDropProxy(t *testing.T, target string) *dropProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	p := &dropProxy{addr: l.Addr().String()}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
			go p.replies(c, s)
		}
	}()
	return p
}

func (p *dropProxy) replies(c, s net.Conn) {
	defer c.Close()
	defer s.Close()
	buf := make([]byte, 1<<16)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			if p.armed.CompareAndSwap(true, false) {
				return
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A claim whose reply is lost, on a client that does not send it again,
// is a 503 whose log says what a lost reply means; the lock it took lapses
// and the handler runs once.
func TestALostClaimReplyIsExplainedAndRunsOnce(t *testing.T) {
	t.Parallel()
	machineClient(t)
	p := newDropProxy(t, machineAddr)
	c := goredis.NewClient(&goredis.Options{Addr: p.addr, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	a := newAPI(t, openStore(t, c), 200*time.Millisecond)
	p.armed.Store(true)
	requireStoreFailed(t, a, a.post(t, "k"), "may or may not have run")
	require.Eventually(t, func() bool { return a.post(t, "k").status == http.StatusCreated }, 10*time.Second, 50*time.Millisecond)
	assert.EqualValues(t, 1, a.runs.Load(), "the handler ran once")
}
