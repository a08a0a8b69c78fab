package redis

import (
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Clock says whose clock judges a lock's lapse and an entry's expiry.
type Clock string

const (
	// ServerClock, the default, judges every lapse on Redis's own clock
	// (TIME, read inside each script), applying the durations the
	// middleware derives from its Config (LockTimeout, Retention): replicas
	// whose clocks disagree never see a lock as stale sooner than Redis
	// does, so a replica whose clock runs ahead cannot take over a lock
	// that is still held. Entries expire through Redis's TTL; Sweep has
	// nothing to do. Instants in the entries the store returns are in the
	// caller's frame (the time it passed, shifted by what Redis measured).
	ServerClock Clock = "S"
	// CallerClock judges by the instants the middleware passes (its
	// replica's clock), as the memory, SQLite and PostgreSQL stores do: for
	// tests that drive time, and for fleets that trust their clocks to
	// agree well within LockTimeout. Sweep then deletes the entries that
	// expired by the caller's time, scanning the store's keys. Every store
	// on one prefix must use the same clock.
	CallerClock Clock = "C"
)

// An Option configures Open.
type Option func(*options)

type options struct {
	prefix         string
	clock          Clock
	logger         *slog.Logger
	requireDurable bool
	allowEviction  bool
	autoPipeline   bool
	policyEvery    time.Duration
	wait           waitReplicas
}

type waitReplicas struct {
	replicas int
	timeout  time.Duration
}

// Prefix sets the prefix of the store's Redis keys. Defaults to "idem:".
// Stores with different prefixes on one Redis are independent. It may not
// contain a brace, which would make it the keys' Cluster hash tag and put
// every entry in one slot.
func Prefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithClock chooses whose clock judges lapses; see Clock.
func WithClock(c Clock) Option { return func(o *options) { o.clock = c } }

// Logger receives the one line Open writes about what a crash of Redis can
// cost. Defaults to slog.Default().
func Logger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// RequireDurable makes Open refuse (ErrNotDurable) a Redis that cannot
// keep an acknowledged completion through its own crash (appendonly yes
// and appendfsync always, on every master), or that will not say
// (CONFIG GET refused).
func RequireDurable() Option { return func(o *options) { o.requireDurable = true } }

// AllowEviction lets Open accept a maxmemory-policy that evicts keys.
// Every entry has a TTL, so volatile-* policies evict them as readily as
// allkeys-* ones; an evicted entry reads as never seen, and the next
// request with its key runs the handler again. Only for deployments whose
// handlers guard themselves (see server.KeyFromContext).
func AllowEviction() Option { return func(o *options) { o.allowEviction = true } }

// WaitReplicas makes Complete wait, with Redis's WAIT, until n replicas
// acknowledged the completion, at most timeout. With fewer, Complete fails
// although the master holds the response: the middleware answers 409 (in
// progress) instead of sending a response a fail-over could still lose, and
// the client's retry gets it replayed from the master. WAIT goes on
// the connection that wrote the completion, which a Cluster client does
// not offer: Open refuses it with a *goredis.ClusterClient.
func WaitReplicas(n int, timeout time.Duration) Option {
	return func(o *options) { o.wait = waitReplicas{replicas: n, timeout: timeout} }
}

// AutoPipeline sends the store's scripts through the client's
// autopipeliner (go-redis's Client.AutoPipeline, which the client owns and
// closes): the scripts of concurrent requests go to Redis in one write
// and their replies come back in one read, instead of a write and a read
// each. Under concurrency that is most of the CPU the store costs, in the
// application and in Redis's one thread (see BENCHMARKS.md); a lone
// request waits a little longer, for the hand-off to the pipeliner's
// goroutine. Open refuses it with a client that has no autopipeliner.
// go-redis marks the autopipeliner experimental.
func AutoPipeline() Option { return func(o *options) { o.autoPipeline = true } }

// PolicyCheckEvery sets how often the store asks Redis again for its
// maxmemory-policy (DefaultPolicyCheck, a minute; and at once when Redis
// refuses a write for lack of memory). A policy that evicts, set after
// Open, is logged at level Error and refused as Open refuses it: new keys
// are refused (the middleware answers 503; keys already stored are still
// replayed) until the policy is noeviction again, unless AllowEviction.
// Zero or less turns the checks off.
func PolicyCheckEvery(d time.Duration) Option { return func(o *options) { o.policyEvery = d } }

func (o *options) check() error {
	switch {
	case strings.ContainsAny(o.prefix, "{}"):
		return fmt.Errorf("redis: Prefix %q contains a brace, which would make it the Cluster hash tag of every key; choose one without", o.prefix)
	case o.clock != ServerClock && o.clock != CallerClock:
		return fmt.Errorf("redis: unknown Clock %q; use ServerClock or CallerClock", string(o.clock))
	case o.wait.replicas < 0 || (o.wait.replicas > 0 && o.wait.timeout <= 0):
		return fmt.Errorf("redis: WaitReplicas(%d, %s): give a positive number of replicas and a positive timeout", o.wait.replicas, o.wait.timeout)
	}
	return nil
}
