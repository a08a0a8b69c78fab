// Package redis keeps the keys of package server's middleware in Redis:
// the replicas of an API that share a Redis (one server, Sentinel or
// Cluster) share one set of keys, so a request retried on another replica
// finds its key there, and concurrent requests with one key run its
// handler once across the fleet.
//
// It is a module of its own, github.com/idemkit/idem/redis, so that an
// application on the other stores never downloads a Redis client. It is
// built on github.com/redis/go-redis/v9: the application builds the
// goredis.UniversalClient and passes it in.
//
//	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
//	store, err := redis.Open(ctx, client)   // logs what a crash of Redis can cost
//	mw, err := server.New(server.Config{Store: store, Scope: tenantOf})
//
// Store passes server/storetest, the suite the memory, SQLite and
// PostgreSQL stores pass.
//
// # Keys
//
// Each (scope, key) is one Redis key, a hash: the prefix ("idem:" by
// default), then the SHA-256 of the scope and the key, in hex, inside
// braces. The braces are a Cluster hash tag: everything of one entry lives
// in one slot, so its scripts run on a Cluster. Any bytes work as scope
// and key (non-UTF-8, NUL, a scope of kilobytes), the Redis key's length is
// fixed, and neither the scope, which may be derived from a credential, nor
// the key is stored in Redis. The hash holds the request's fingerprint,
// method and path, the state, the fencing token, the instants, and once
// completed the response.
//
// # Operations
//
// Claim, Complete, Release, Renew and Get are each one Lua script, sent
// with EVALSHA (and EVAL when the server's script cache lost it, after a
// restart or a SCRIPT FLUSH): one round trip, atomic with every other
// command on the key. Each call carries a nonce, so that a call the client
// sent again after losing the reply to the first sending recognises its
// own earlier effect instead of refusing it as a stranger's.
//
// # Time
//
// By default (ServerClock) a lock's lapse and an entry's expiry are judged
// on Redis's clock: the scripts read TIME and apply the durations the
// middleware derives from its Config (LockTimeout, Retention), and the
// entry's TTL is its retention, so Redis deletes it itself and Sweep has
// nothing to do. Replicas whose clocks disagree cannot take a held lock
// over early. With CallerClock the store judges by the instants the
// middleware passes, as the other stores do; Sweep then scans the store's
// keys.
//
// # Fencing tokens
//
// A token is the greater of the key's last token plus one and Redis's
// clock in microseconds. While the entry lives (and a released entry
// leaves a tombstone with its token for the rest of its TTL) tokens of one
// key strictly increase; once it expired, the next token is still greater
// than every earlier one, because the clock moved on by at least the
// retention, unless Redis's clock was set back by more than that. So a
// take-over's token refuses the first holder's late completion, and no
// expiry ever hands an old token out again. A fail-over to a replica that
// had not received the last writes, with a clock behind the master's, is
// the one way around it; see Durability.
//
// # Durability
//
// What a crash of Redis can cost depends on the server's persistence, and
// Open says it in one log line. With no append-only file (appendonly no,
// the machine default of many installs) a crash loses every entry written
// since the last snapshot: a completed key that is lost reads as never
// seen, and the client's retry runs the handler again. With appendfsync
// everysec a crash of the Redis process loses nothing acknowledged, but a
// crash of its machine loses about the last second. Only appendonly yes
// with appendfsync always keeps every acknowledged completion through a
// crash; RequireDurable makes Open refuse anything less. On a server with
// replicas, WaitReplicas makes each completion wait for them, so that a
// fail-over cannot lose it. A maxmemory-policy that evicts may drop an
// entry before its retention ends: Open refuses it unless AllowEviction,
// and the store asks again every minute (PolicyCheckEvery), refusing new
// keys while one is set.
//
// Under concurrency, AutoPipeline sends the scripts of concurrent requests
// to Redis together, through the client's autopipeliner.
//
// # Failures
//
// Every failure of Redis (unreachable, a timeout, out of memory, a Cluster
// moving a slot) comes back wrapping ErrUnavailable, with what it means;
// the middleware then answers 503 with Retry-After, having run nothing,
// or, once the handler ran, keeps the key held and stores the response
// again. A timeout leaves a script run or not: either way the key is never
// run twice, and the retry finds the entry as the script left it. On a
// Cluster, a failure makes the store ask the client to reload its slot
// map, so that once a dead master's replica is promoted the store finds it
// within seconds rather than at go-redis's periodic reload.
package redis
