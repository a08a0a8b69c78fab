package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	goredis "github.com/redis/go-redis/v9"
)

// Errors from Open and from the store's operations, matched with
// errors.Is.
var (
	// ErrUnavailable: Redis could not be reached, or refused or failed an
	// operation (out of memory, a Cluster in the middle of a fail-over, a
	// timeout). The middleware answers such a failure with a 503 problem
	// and Retry-After; the error it logs says what happened.
	ErrUnavailable = errors.New("redis store unavailable")
	// ErrNotDurable: RequireDurable was given and the server cannot keep
	// an acknowledged completion through its crash, or will not say.
	ErrNotDurable = errors.New("redis server does not keep completions durably")
	// ErrEvicts: the server's maxmemory-policy may evict the store's keys,
	// and AllowEviction was not given.
	ErrEvicts = errors.New("redis server may evict the store's keys")
	// ErrReplica: the client's server is a replica, not a master.
	ErrReplica = errors.New("redis server is a replica")
)

// Open returns the store on client, which the application builds (with
// goredis.NewClient, NewFailoverClient, NewClusterClient or
// NewUniversalClient) and closes. It asks the server how it persists
// (CONFIG GET appendonly, appendfsync, maxmemory-policy; INFO replication,
// on every master of a Cluster) and logs in one line what a crash of
// Redis can cost. It refuses a server it cannot reach (ErrUnavailable), a
// replica (ErrReplica), a maxmemory-policy that evicts (ErrEvicts, unless
// AllowEviction), and, with RequireDurable, a server that cannot keep
// completions through a crash or will not say (ErrNotDurable).
func Open(ctx context.Context, client goredis.UniversalClient, opts ...Option) (*Store, error) {
	if client == nil {
		return nil, errors.New("redis: Open needs a client; build one with goredis.NewClient, NewClusterClient or NewUniversalClient")
	}
	o := options{prefix: "idem:", clock: ServerClock, logger: slog.Default(), policyEvery: DefaultPolicyCheck}
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	if _, cluster := client.(*goredis.ClusterClient); cluster && o.wait.replicas > 0 {
		return nil, errors.New("redis: WaitReplicas needs the connection that wrote the completion, which a Cluster client does not give; " +
			"on a Cluster, make the masters durable (appendfsync always) instead")
	}
	d, err := probe(ctx, client)
	if errors.Is(err, ErrReplica) {
		return nil, fmt.Errorf("redis: Open: %w", err)
	}
	if err != nil {
		return nil, fmt.Errorf("redis: Open: %w: %w; check the client's address and that Redis runs", ErrUnavailable, err)
	}
	if d.Evicts() && !o.allowEviction {
		return nil, fmt.Errorf("redis: Open: %w: maxmemory-policy is %s, which may drop an entry before its retention ends, "+
			"and the next request with its key would run the handler again; set maxmemory-policy noeviction, or pass AllowEviction",
			ErrEvicts, d.EvictionPolicy)
	}
	if o.requireDurable && !d.Durable() {
		return nil, fmt.Errorf("redis: Open: %w: %s; set appendonly yes and appendfsync always on every master, or drop RequireDurable",
			ErrNotDurable, d.Cost())
	}
	level := slog.LevelInfo
	if !d.Durable() {
		level = slog.LevelWarn
	}
	o.logger.LogAttrs(ctx, level, "idem redis store: "+d.Cost(), slog.String("prefix", o.prefix))
	var scripts goredis.Scripter = client
	if o.autoPipeline {
		ap, ok := client.(interface {
			AutoPipeline() (*goredis.AutoPipeliner, error)
		})
		if !ok {
			return nil, fmt.Errorf("redis: Open: AutoPipeline needs a *goredis.Client or *goredis.ClusterClient, not a %T", client)
		}
		p, err := ap.AutoPipeline()
		if err != nil {
			return nil, fmt.Errorf("redis: Open: AutoPipeline: %w", err)
		}
		scripts = p
	}
	s := &Store{client: client, scripts: scripts, prefix: o.prefix, clock: o.clock, durable: d, wait: o.wait, logger: o.logger}
	s.policy.allow = o.allowEviction
	s.notePolicyQuietly(d)
	if o.policyEvery > 0 {
		s.policy.kick, s.policy.stop, s.policy.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
		go s.watchPolicy(o.policyEvery)
	}
	return s, nil
}
