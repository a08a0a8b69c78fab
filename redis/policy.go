package redis

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// DefaultPolicyCheck is how often the store asks Redis again for its
// maxmemory-policy (see PolicyCheckEvery).
const DefaultPolicyCheck = time.Minute

// watchPolicy asks the server for its maxmemory-policy every interval,
// and at once when a script was refused for lack of memory (the moment an
// evicting policy would start dropping entries), until Close. Open refused
// an evicting policy; one set later (CONFIG SET, a managed service's
// parameter group) would drop entries, and the next request with a
// dropped key would run its handler again, unseen.
func (s *Store) watchPolicy(every time.Duration) {
	defer close(s.policy.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.policy.stop:
			return
		case <-t.C:
		case <-s.policy.kick:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		d, err := probe(ctx, s.client)
		cancel()
		if err == nil {
			// An unreachable Redis says nothing of its policy; the
			// operations report it.
			s.notePolicy(d)
		}
	}
}

// notePolicy records what the server said of its policy, and logs a
// change.
func (s *Store) notePolicy(d Durability) {
	evicting := ""
	if d.Evicts() {
		evicting = d.EvictionPolicy
	}
	was := s.policy.evicting.Swap(&evicting)
	if was != nil && *was == evicting {
		return
	}
	switch {
	case evicting != "" && s.policy.allow:
		s.logger.LogAttrs(context.Background(), slog.LevelWarn, "idem redis store: maxmemory-policy is now "+evicting+
			", which may drop an entry before its retention ends: the next request with its key would run the handler again (AllowEviction was given)",
			slog.String("prefix", s.prefix))
	case evicting != "":
		s.logger.LogAttrs(context.Background(), slog.LevelError, "idem redis store: maxmemory-policy is now "+evicting+
			", which may drop an entry before its retention ends: the store refuses new keys (503) until it is noeviction again; "+
			"set maxmemory-policy noeviction, or open the store with AllowEviction",
			slog.String("prefix", s.prefix))
	case was != nil && *was != "":
		s.logger.LogAttrs(context.Background(), slog.LevelInfo, "idem redis store: maxmemory-policy is "+d.EvictionPolicy+
			" again: the store takes new keys", slog.String("prefix", s.prefix))
	}
}

// refusesClaims returns the error the claim of a new key gets while the
// server's policy evicts and AllowEviction was not given, or nil.
func (s *Store) refusesClaims() error {
	p := s.policy.evicting.Load()
	if p == nil || *p == "" || s.policy.allow {
		return nil
	}
	return fmt.Errorf("redis store (prefix %q): claim: %w: %w: maxmemory-policy is now %s, which may drop an entry before its retention ends, "+
		"and the next request with its key would run the handler again; set maxmemory-policy noeviction, or pass AllowEviction",
		s.prefix, ErrUnavailable, ErrEvicts, *p)
}

// recheckPolicy asks the watcher to check the policy now, if err is
// Redis refusing a write for lack of memory.
func (s *Store) recheckPolicy(err error) {
	if s.policy.kick == nil || !goredis.IsOOMError(err) {
		return
	}
	select {
	case s.policy.kick <- struct{}{}:
	default:
	}
}

// notePolicyQuietly records the policy Open found, which its own line
// already said.
func (s *Store) notePolicyQuietly(d Durability) {
	evicting := ""
	if d.Evicts() {
		evicting = d.EvictionPolicy
	}
	s.policy.evicting.Store(&evicting)
}
