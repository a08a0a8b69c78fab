package redis

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/server"
)

// Store is a server.Store in Redis: every replica of an API opens it on the
// same Redis (one server, Sentinel or Cluster) and they share one set of
// keys. It is safe for concurrent use. Open it with Open.
//
// Each idempotency key is one Redis key, a hash, named from the store's
// prefix and the SHA-256 of the scope and the key inside a hash tag (see
// Key); every operation is one Lua script on that key, so it is atomic
// across every process that shares the Redis, and works on a Cluster. The
// package documentation says what a crash of Redis can cost, and how to
// make completions durable.
type Store struct {
	client goredis.UniversalClient
	// scripts runs the operations' scripts: the client, or its
	// autopipeliner (AutoPipeline).
	scripts goredis.Scripter
	prefix  string
	clock   Clock
	closed  atomic.Bool
	durable Durability
	wait    waitReplicas
	logger  *slog.Logger
	policy  policyWatch
}

// policyWatch is the goroutine that asks Redis again for its
// maxmemory-policy (policy.go), and what it learnt.
type policyWatch struct {
	allow    bool // AllowEviction
	evicting atomic.Pointer[string]
	kick     chan struct{}
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
}

var _ server.Store = (*Store)(nil)

// Key returns the Redis key that holds (scope, key) under prefix: the
// prefix, then the hex SHA-256 of the scope's length, the scope and the key
// in braces, a hash tag, so that whatever else a later version keeps for
// the entry lands in the same Cluster slot. Neither the scope (which may
// be derived from a credential) nor the key appears in it, any bytes work,
// and its length is fixed.
func Key(prefix, scope, key string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(scope)))])
	_, _ = io.WriteString(h, scope)
	_, _ = io.WriteString(h, key)
	var sum [sha256.Size]byte
	return prefix + "{" + hex.EncodeToString(h.Sum(sum[:0])) + "}"
}

// Prefix returns the prefix of the store's Redis keys.
func (s *Store) Prefix() string { return s.prefix }

// Durability returns what Open learnt of the server's persistence.
func (s *Store) Durability() Durability { return s.durable }

// Close makes later calls fail with server.ErrStoreClosed; calls in
// progress finish. It stops the goroutine that checks the server's
// maxmemory-policy; the client belongs to the application, which closes
// it.
func (s *Store) Close() error {
	s.closed.Store(true)
	s.policy.once.Do(func() {
		if s.policy.stop != nil {
			close(s.policy.stop)
			<-s.policy.done
		}
	})
	return nil
}

// Claim implements server.Store.
func (s *Store) Claim(ctx context.Context, req server.ClaimRequest) (server.ClaimResult, error) {
	if err := s.enter(ctx); err != nil {
		return server.ClaimResult{}, err
	}
	if refused := s.refusesClaims(); refused != nil {
		// An entry that exists is answered (replayed, or in progress);
		// only a new key, whose entry the policy could drop, is refused.
		e, err := s.Get(ctx, req.Scope, req.Key, req.Now)
		if errors.Is(err, server.ErrNotFound) {
			return server.ClaimResult{}, refused
		}
		return server.ClaimResult{Entry: e}, err
	}
	args := []any{string(s.clock), req.Fingerprint, req.Method, req.Path, nonce()}
	if s.clock == ServerClock {
		ls, ln := seconds(req.Now.Sub(req.StaleBefore))
		rs, rn := seconds(req.ExpiresAt.Sub(req.Now))
		args = append(args, ls, ln, rs, rn)
	} else {
		now, err := instant(req.Now)
		if err != nil {
			return server.ClaimResult{}, badTime("claim", err)
		}
		stale, err := instant(req.StaleBefore)
		if err != nil {
			return server.ClaimResult{}, badTime("claim", err)
		}
		expires, err := instant(req.ExpiresAt)
		if err != nil {
			return server.ClaimResult{}, badTime("claim", err)
		}
		args = append(args, now, stale, expires)
	}
	reply, err := claimScript.Run(ctx, s.scripts, []string{Key(s.prefix, req.Scope, req.Key)}, args...).Slice()
	if err != nil {
		return server.ClaimResult{}, s.fail(ctx, "claim", err)
	}
	code, e, err := entryOf(reply, req.Scope, req.Key, req.Now)
	if err != nil {
		return server.ClaimResult{}, s.fail(ctx, "claim", err)
	}
	switch code {
	case "new", "mine":
		return server.ClaimResult{Claimed: true, Token: e.Token, Entry: e}, nil
	case "took":
		return server.ClaimResult{Claimed: true, TookOver: true, Token: e.Token, Entry: e}, nil
	}
	return server.ClaimResult{Entry: e}, nil
}

// Complete implements server.Store. With WaitReplicas it returns once
// that many replicas acknowledged the completion, or fails.
func (s *Store) Complete(ctx context.Context, req server.CompleteRequest) error {
	if req.Response == nil {
		return errors.New("redis store: Complete without a response")
	}
	if err := s.enter(ctx); err != nil {
		return err
	}
	args := []any{string(s.clock), strconv.FormatInt(req.Token, 10), nonce()}
	if s.clock == ServerClock {
		// The retention, as a duration: the store's clock is used only to
		// turn the middleware's instant back into one.
		rs, rn := seconds(time.Until(req.ExpiresAt))
		args = append(args, rs, rn)
	} else {
		expires, err := instant(req.ExpiresAt)
		if err != nil {
			return badTime("complete", err)
		}
		args = append(args, expires, "")
	}
	body := req.Response.Body
	if body == nil {
		body = []byte{}
	}
	args = append(args, req.Response.Status, wire.EncodeHeader(req.Response.Header), body)
	key := []string{Key(s.prefix, req.Scope, req.Key)}
	var reply string
	var err error
	if s.wait.replicas > 0 {
		reply, err = s.completeAndWait(ctx, key, args)
	} else {
		reply, err = completeScript.Run(ctx, s.scripts, key, args...).Text()
	}
	if err != nil {
		return s.fail(ctx, "complete", err)
	}
	if reply != "ok" {
		return server.ErrLockLost
	}
	return nil
}

// Release implements server.Store.
func (s *Store) Release(ctx context.Context, scope, key string, token int64) error {
	return s.fenced(ctx, "release", releaseScript, scope, key, string(s.clock), strconv.FormatInt(token, 10), nonce())
}

// Renew implements server.Store.
func (s *Store) Renew(ctx context.Context, scope, key string, token int64, now time.Time) error {
	at := ""
	if s.clock == CallerClock {
		var err error
		if at, err = instant(now); err != nil {
			return badTime("renew", err)
		}
	}
	return s.fenced(ctx, "renew", renewScript, scope, key, string(s.clock), strconv.FormatInt(token, 10), at)
}

// fenced runs a script that changes the entry only while the token holds
// its lock, and answers "ok" or "lost".
func (s *Store) fenced(ctx context.Context, op string, script *goredis.Script, scope, key string, args ...any) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	reply, err := script.Run(ctx, s.scripts, []string{Key(s.prefix, scope, key)}, args...).Text()
	if err != nil {
		return s.fail(ctx, op, err)
	}
	if reply != "ok" {
		return server.ErrLockLost
	}
	return nil
}

// Get implements server.Store.
func (s *Store) Get(ctx context.Context, scope, key string, now time.Time) (server.Entry, error) {
	if err := s.enter(ctx); err != nil {
		return server.Entry{}, err
	}
	at := ""
	if s.clock == CallerClock {
		var err error
		if at, err = instant(now); err != nil {
			return server.Entry{}, badTime("get", err)
		}
	}
	reply, err := getScript.Run(ctx, s.scripts, []string{Key(s.prefix, scope, key)}, string(s.clock), at).Slice()
	if err != nil {
		return server.Entry{}, s.fail(ctx, "get", err)
	}
	code, e, err := entryOf(reply, scope, key, now)
	if err != nil {
		return server.Entry{}, s.fail(ctx, "get", err)
	}
	if code == "none" {
		return server.Entry{}, server.ErrNotFound
	}
	return e, nil
}

func (s *Store) enter(ctx context.Context) error {
	if s.closed.Load() {
		return server.ErrStoreClosed
	}
	return ctx.Err()
}

// nonce names one call of a script, so that the script, sent again by the
// client after the reply to the first sending was lost, recognises its own
// earlier effect.
func nonce() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// badTime is the error of an instant the store cannot keep.
func badTime(op string, err error) error {
	return fmt.Errorf("redis store: %s: %w", op, err)
}

// instant formats t as the scripts keep instants: 11 digits of Unix
// seconds and 9 of nanoseconds.
func instant(t time.Time) (string, error) {
	if t.Unix() < 0 || t.Unix() > 99999999999 {
		return "", fmt.Errorf("time %s is outside what the store keeps (1970 to year 5138)", t)
	}
	return fmt.Sprintf("%011d%09d", t.Unix(), t.Nanosecond()), nil
}

// parseInstant reads what instant writes.
func parseInstant(s string) (time.Time, error) {
	if len(s) != 20 {
		return time.Time{}, fmt.Errorf("stored instant %q is not 20 digits", s)
	}
	sec, err1 := strconv.ParseInt(s[:11], 10, 64)
	nsec, err2 := strconv.ParseInt(s[11:], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return time.Time{}, fmt.Errorf("stored instant %q: %w", s, err)
	}
	return time.Unix(sec, nsec), nil
}

// seconds splits d, at least zero, into whole seconds and nanoseconds.
func seconds(d time.Duration) (int64, int64) {
	d = max(d, 0)
	return int64(d / time.Second), int64(d % time.Second)
}

// entryOf reads a script's reply: a code, the instant the script judged by,
// then the entry's fields (s t f m p c l e rs rh rb) unless the code is
// "none". Instants come back in the caller's frame: now is the caller's
// instant for the script's.
func entryOf(reply []any, scope, key string, now time.Time) (string, server.Entry, error) {
	str := func(i int) string {
		if i < len(reply) {
			if s, ok := reply[i].(string); ok {
				return s
			}
		}
		return ""
	}
	code := str(0)
	if code == "none" {
		return code, server.Entry{}, nil
	}
	if len(reply) != 13 {
		return "", server.Entry{}, fmt.Errorf("the script answered %d values, not 13: is another program writing under the store's prefix?", len(reply))
	}
	judged, err := parseInstant(str(1))
	if err != nil {
		return "", server.Entry{}, err
	}
	at := func(i int) (time.Time, error) {
		t, err := parseInstant(str(i))
		return now.Add(t.Sub(judged)), err
	}
	e := server.Entry{Scope: scope, Key: key, Fingerprint: str(4), Method: str(5), Path: str(6)}
	state, err1 := strconv.Atoi(str(2))
	e.State = server.EntryState(state)
	var err2, err3, err4, err5 error
	e.Token, err2 = strconv.ParseInt(str(3), 10, 64)
	e.CreatedAt, err3 = at(7)
	e.LockedAt, err4 = at(8)
	e.ExpiresAt, err5 = at(9)
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		return "", server.Entry{}, fmt.Errorf("stored entry does not parse: %w", err)
	}
	if e.State == server.Completed {
		status, err := strconv.Atoi(str(10))
		if err != nil {
			return "", server.Entry{}, fmt.Errorf("stored response status does not parse: %w", err)
		}
		r := &server.StoredResponse{Status: status, Body: []byte(str(12))}
		if r.Header, err = wire.DecodeHeader([]byte(str(11))); err != nil {
			return "", server.Entry{}, fmt.Errorf("stored response header does not parse: %w", err)
		}
		e.Response = r
	}
	return code, e, nil
}
