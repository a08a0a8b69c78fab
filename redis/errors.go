package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	goredis "github.com/redis/go-redis/v9"
)

// fail wraps a failure of op with the store's prefix, ErrUnavailable and
// what it means for the key.
func (s *Store) fail(ctx context.Context, op string, err error) error {
	s.recheckPolicy(err)
	if ctxErr := ctx.Err(); ctxErr != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || isTimeout(err)) {
		return fmt.Errorf("redis store (prefix %q): %s: %w", s.prefix, op, ctxErr)
	}
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		// A master that died fails with a dial error, not a MOVED, and
		// go-redis reloads the slot map on MOVED or every
		// ClusterStateReloadInterval (a minute by default) only: until
		// then it keeps sending the key's commands to the dead master,
		// long after its replica was promoted. Ask for a reload now (it
		// runs in the background, once however many calls ask).
		cc.ReloadState(context.Background())
	}
	return fmt.Errorf("redis store (prefix %q): %s: %w: %w%s", s.prefix, op, ErrUnavailable, err, hint(err))
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// hint says what a failure means and what to do.
func hint(err error) string {
	msg := err.Error()
	_, moved := goredis.IsMovedError(err)
	_, ask := goredis.IsAskError(err)
	switch {
	case goredis.IsOOMError(err) || strings.Contains(msg, "OOM command not allowed"):
		return " (Redis is out of memory under maxmemory and refused the write, changing nothing: raise maxmemory or free memory)"
	case isTimeout(err):
		return " (no answer in time: the script may or may not have run; either way the key is never run twice, and a retry with it finds the entry as the script left it)"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET):
		return " (the connection to Redis closed before its answer: the script may or may not have run; either way the key is never run twice, and a retry with it finds the entry as the script left it)"
	case moved || ask || goredis.IsClusterDownError(err) || goredis.IsTryAgainError(err):
		return " (the Cluster is moving the key's slot or failing over: retry shortly)"
	case goredis.IsReadOnlyError(err):
		return " (the node is a replica, as during a fail-over: retry shortly)"
	case goredis.IsLoadingError(err):
		return " (Redis is loading its data after a restart: retry shortly)"
	case errors.Is(err, goredis.ErrClosed):
		return " (the application closed the Redis client)"
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return " (Redis cannot be reached: check that it runs and that the client's address is right)"
	}
	return ""
}
