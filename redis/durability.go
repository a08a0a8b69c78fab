package redis

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// Durability is what Open learnt of how the server keeps what it is told:
// of the weakest master, on a Cluster.
type Durability struct {
	// Known is false when the server refused CONFIG GET (some managed
	// services do): nothing below is then known but Replicas, and
	// EvictionPolicy when INFO memory tells it.
	Known bool
	// AppendOnly and AppendFsync are the settings of that name.
	AppendOnly  bool
	AppendFsync string
	// EvictionPolicy is maxmemory-policy, or "" when unknown.
	EvictionPolicy string
	// Replicas is the number of connected replicas (INFO replication).
	Replicas int
}

// Durable reports whether an acknowledged completion survives a crash of
// Redis and of its machine: an append-only file fsynced before each reply.
func (d Durability) Durable() bool {
	return d.Known && d.AppendOnly && d.AppendFsync == "always"
}

// Evicts reports whether maxmemory-policy may evict the store's keys: any
// policy but noeviction, since every entry has a TTL.
func (d Durability) Evicts() bool {
	return d.EvictionPolicy != "" && d.EvictionPolicy != "noeviction"
}

// Cost says in one sentence what a crash of Redis can cost.
func (d Durability) Cost() string {
	var s string
	switch {
	case !d.Known:
		s = "the server does not say how it persists (CONFIG GET refused): a crash of Redis may lose completions, and a retry of a lost one runs its handler again"
	case !d.AppendOnly:
		s = "appendonly no: a crash of Redis loses every entry written since its last snapshot, if any; a retry of a lost completion runs its handler again"
	case d.AppendFsync == "always":
		s = "appendonly yes, appendfsync always: every acknowledged completion is on disk; a crash of Redis or of its machine loses none"
	case d.AppendFsync == "everysec":
		s = "appendonly yes, appendfsync everysec: a crash of the Redis process loses nothing acknowledged, a crash of its machine about the last second; a retry of a lost completion runs its handler again"
	default:
		s = fmt.Sprintf("appendonly yes, appendfsync %s: a crash of Redis's machine loses what the kernel had not yet written (up to about 30 s); a retry of a lost completion runs its handler again", d.AppendFsync)
	}
	if d.Replicas > 0 {
		s += fmt.Sprintf("; %d replica(s): a fail-over to one loses what it had not yet received (see WaitReplicas)", d.Replicas)
	}
	return s
}

// probe asks every master how it persists and returns the weakest answer.
// It fails only when a master cannot be reached.
func probe(ctx context.Context, client goredis.UniversalClient) (Durability, error) {
	var (
		mu    sync.Mutex
		all   []Durability
		visit = func(ctx context.Context, c goredis.Cmdable) error {
			d, err := probeNode(ctx, c)
			if err != nil {
				return err
			}
			mu.Lock()
			all = append(all, d)
			mu.Unlock()
			return nil
		}
	)
	var err error
	switch c := client.(type) {
	case *goredis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error { return visit(ctx, n) })
	case *goredis.Ring:
		err = c.ForEachShard(ctx, func(ctx context.Context, n *goredis.Client) error { return visit(ctx, n) })
	default:
		err = visit(ctx, client)
	}
	if err != nil {
		return Durability{}, err
	}
	if len(all) == 0 {
		return Durability{}, fmt.Errorf("the client knows no master")
	}
	w := all[0]
	for _, d := range all[1:] {
		if rank(d) < rank(w) {
			w = d
		}
		if d.Evicts() && !w.Evicts() {
			w.EvictionPolicy = d.EvictionPolicy
		}
		w.Replicas = min(w.Replicas, d.Replicas)
	}
	return w, nil
}

// rank orders settings from the weakest.
func rank(d Durability) int {
	switch {
	case !d.Known:
		return 0
	case !d.AppendOnly:
		return 1
	case d.AppendFsync == "always":
		return 4
	case d.AppendFsync == "everysec":
		return 3
	}
	return 2
}

func probeNode(ctx context.Context, c goredis.Cmdable) (Durability, error) {
	if err := c.Ping(ctx).Err(); err != nil {
		return Durability{}, err
	}
	var d Durability
	if info, err := c.Info(ctx, "replication").Result(); err == nil {
		// A replica refuses the scripts' writes or, writable, keeps them
		// to itself, unseen by the master and the other replicas.
		if role := infoField(info, "role"); role != "" && role != "master" {
			return Durability{}, fmt.Errorf("%w (INFO replication says role:%s, of master %s:%s): point the client at the master, "+
				"or use a Sentinel or Cluster client that finds it", ErrReplica, role, infoField(info, "master_host"), infoField(info, "master_port"))
		}
		d.Replicas, _ = strconv.Atoi(infoField(info, "connected_slaves"))
	}
	get := func(name string) (string, bool) {
		m, err := c.ConfigGet(ctx, name).Result()
		if err != nil {
			return "", false
		}
		v, ok := m[name]
		return v, ok
	}
	aof, ok1 := get("appendonly")
	fsync, ok2 := get("appendfsync")
	policy, ok3 := get("maxmemory-policy")
	if !ok1 || !ok2 || !ok3 {
		// INFO memory tells the policy to whoever may not run CONFIG (an
		// ACL user without it, a managed service that renames it), and an
		// evicting one must be refused there too.
		if info, err := c.Info(ctx, "memory").Result(); err == nil {
			d.EvictionPolicy = infoField(info, "maxmemory_policy")
		}
		return d, nil
	}
	d.Known, d.AppendOnly, d.AppendFsync, d.EvictionPolicy = true, aof == "yes", fsync, policy
	return d, nil
}

// infoField returns a field of an INFO reply.
func infoField(info, name string) string {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
