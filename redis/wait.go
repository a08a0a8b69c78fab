package redis

import (
	"context"
	"fmt"

	goredis "github.com/redis/go-redis/v9"
)

// completeAndWait runs the completion and WAIT in one pipeline, so that
// both go on one connection: WAIT waits for that connection's writes.
func (s *Store) completeAndWait(ctx context.Context, key []string, args []any) (string, error) {
	run := func(eval bool) (*goredis.Cmd, *goredis.Cmd, error) {
		var done *goredis.Cmd
		var wait *goredis.Cmd
		_, err := s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			if eval {
				done = completeScript.Eval(ctx, p, key, args...)
			} else {
				done = completeScript.EvalSha(ctx, p, key, args...)
			}
			wait = p.Do(ctx, "WAIT", s.wait.replicas, s.wait.timeout.Milliseconds())
			return nil
		})
		return done, wait, err
	}
	done, wait, err := run(false)
	if goredis.HasErrorPrefix(done.Err(), "NOSCRIPT") {
		done, wait, err = run(true)
	}
	if err := done.Err(); err != nil {
		return "", err
	}
	reply, err2 := done.Text()
	if err2 != nil {
		return "", err2
	}
	if reply != "ok" {
		return reply, nil
	}
	if err != nil {
		return "", err
	}
	n, err := wait.Int64()
	if err != nil {
		return "", err
	}
	if n < int64(s.wait.replicas) {
		return "", fmt.Errorf("the completion reached %d of the %d replicas WaitReplicas asks for within %s: it is stored on the master, "+
			"where a retry of the key finds it, but a fail-over now could lose it",
			n, s.wait.replicas, s.wait.timeout)
	}
	return reply, nil
}
