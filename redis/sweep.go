package redis

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// sweepBatch is how many keys one SCAN step asks for, and so how many
// sweep scripts go in one pipeline.
const sweepBatch = 500

// Sweep implements server.Store. Under the server clock Redis deletes
// each entry itself when its TTL runs out, on the instant the store would
// judge it expired, so there is nothing to sweep and Sweep returns 0
// without a round trip. Under the caller clock it scans the store's keys
// (SCAN, on every master of a Cluster) and deletes, one script each, those
// that expired by now.
func (s *Store) Sweep(ctx context.Context, now time.Time) (int, error) {
	if err := s.enter(ctx); err != nil {
		return 0, err
	}
	if s.clock == ServerClock {
		return 0, nil
	}
	at, err := instant(now)
	if err != nil {
		return 0, badTime("sweep", err)
	}
	var total atomic.Int64
	node := func(ctx context.Context, c *goredis.Client) error { return s.sweepWith(ctx, c, at, &total) }
	switch c := s.client.(type) {
	case *goredis.ClusterClient:
		err = c.ForEachMaster(ctx, node)
	case *goredis.Ring:
		err = c.ForEachShard(ctx, node)
	default:
		err = s.sweepWith(ctx, s.client, at, &total)
	}
	if err != nil {
		return int(total.Load()), s.fail(ctx, "sweep", err)
	}
	return int(total.Load()), nil
}

// sweepWith scans the keys of one node and sweeps them in pipelines.
func (s *Store) sweepWith(ctx context.Context, c goredis.UniversalClient, at string, total *atomic.Int64) error {
	match := globEscape(s.prefix) + "{*}"
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, match, sweepBatch).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			n, err := s.sweepKeys(ctx, c, keys, at)
			total.Add(int64(n))
			if err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// sweepKeys runs the sweep script on keys in one pipeline, with EVAL for
// all of them if the server's script cache does not hold it.
func (s *Store) sweepKeys(ctx context.Context, c goredis.UniversalClient, keys []string, at string) (int, error) {
	run := func(eval bool) (int, error) {
		cmds := make([]*goredis.Cmd, len(keys))
		_, err := c.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i, k := range keys {
				if eval {
					cmds[i] = sweepScript.Eval(ctx, p, []string{k}, at)
				} else {
					cmds[i] = sweepScript.EvalSha(ctx, p, []string{k}, at)
				}
			}
			return nil
		})
		n := 0
		for _, cmd := range cmds {
			if v, err := cmd.Int(); err == nil {
				n += v
			}
		}
		return n, err
	}
	n, err := run(false)
	if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		m, err := run(true)
		return n + m, err
	}
	return n, err
}

// globEscape quotes the characters SCAN's MATCH would take for a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
