// Package server is net/http middleware that makes a service's
// state-changing routes safe to retry: it implements the IETF httpapi draft
// "The Idempotency-Key HTTP Header Field" and the status endpoint that idem
// clients ask when an outcome is unknown.
//
//	mw, err := server.New(server.Config{
//		Store: store, // server.OpenSQLiteStore("keys.db")
//		Scope: func(r *http.Request) string { return tenantOf(r) }, // or server.SingleTenant
//	})
//	defer mw.Close()
//	mux.Handle("POST /orders", mw.Handler(createOrder))
//	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
//	http.ListenAndServe(addr, authenticate(mux)) // the same authentication for both
//
// examples/server holds the whole pattern in a program and its package
// orders, on this package, database/sql and the SQLite driver only.
//
// # Model
//
// A client sends one key per logical operation, in the Idempotency-Key
// header, as a bare token (abc) or an RFC 8941 string ("abc"): both are the
// same key. The middleware keeps one entry per (scope, key), where the scope
// is the caller's tenant or credential (Config.Scope). The entry holds the
// request's fingerprint, a SHA-256 of its method, path with raw query, and
// body, and, once the handler has answered, the response.
//
// For a request with a key on an idempotent method (POST and PATCH by
// default):
//
//   - no entry: the key is claimed atomically (one of any number of
//     concurrent requests wins), the handler runs once, and its response is
//     stored, then sent;
//   - an entry with another fingerprint: 422 problem, type
//     urn:idem:problem:key-reused. A key used on one route never replays
//     there a result of another route: the detail names the route it was
//     first used on;
//   - an entry in progress: 409 problem, type urn:idem:problem:in-progress,
//     with Retry-After;
//   - a completed entry: the stored response, status, headers and body byte
//     for byte, with Idempotent-Replayed: true.
//
// A request without a key gets 400 (urn:idem:problem:key-missing), a
// malformed or too long key 400 (urn:idem:problem:key-invalid), a body over
// MaxBodyBytes 413 (urn:idem:problem:body-too-large). When the store cannot
// record the claim the answer is 503 (urn:idem:problem:store-unavailable)
// with Retry-After, and the handler does not run. Every error is an RFC 9457
// application/problem+json body; none of them is stored (the one problem
// the middleware stores is the 500 of a handler that panicked, see
// Policies).
//
// # What runs once
//
// The handler runs once per (scope, key) while the entry is kept, whatever
// fails after it started: concurrent duplicates get 409; a client that
// disconnects or times out gets the stored response on its retry; a store
// that fails to record the response keeps the key held and is retried
// (below); a handler that panicked or answered 5xx has that failure stored
// and replayed (StoreAll, the default). It may run again for the same key
// in these cases only:
//
//   - Its process died, or could not reach the store for LockTimeout, after
//     the claim and before the response was stored. The key's lock goes
//     stale after LockTimeout, and the next request with the key and the
//     same payload runs the handler again. A handler cut off from the store
//     is told to stop first, and if it then fails, its failure is not
//     stored either: the key is run again once its lock is stale (see
//     Stale locks and fencing).
//   - The store lost a stored response: a MemoryStore on restart, an
//     SQLiteStore opened with SQLiteDeferCompletes in a power failure. The
//     key then reads as absent or as a stale lock, as above.
//   - The entry expired after Retention: a request reusing the key is a
//     new request.
//   - The application opted into SkipServerErrors: after a 5xx or a panic
//     the key is released, and the next request with it runs the handler.
//
// The first two are what the application's own guard is for (see The
// second guard): with the key stored under a UNIQUE constraint in the
// transaction of the effect, the second run finds the first run's record
// and answers with it. Idem clients stop resending before the retention
// ends, which covers the third; the fourth is the application's choice.
//
// # Store first, then send
//
// The handler writes into a buffer. The middleware stores the response and
// only then writes it to the client, so any response a client could have
// seen is replayable: a client whose connection dropped after the server
// answered, or whose timeout fired just before the answer arrived, retries
// with the same key and gets that very response. The price is that a
// handler's response is buffered in full: handlers on idempotent routes
// cannot stream, and http.ResponseController's Flush and Hijack report
// http.ErrNotSupported. Set-Cookie goes to the first caller only and is
// never stored: a response that is not sent to its first caller (a store
// that fails or takes longer than LockTimeout/3 to record it, below) sets
// no cookie at all, as the replay that answers the retry carries none. If
// the store fails to record the response, the response is not sent, and
// the key is not released: it stays held (the heartbeat keeps
// its lock fresh) while the middleware retries storing in the background,
// and the client gets 409 in progress with Retry-After, which an idem
// client reads as "wait, then ask the status endpoint". The status endpoint
// answers processing until the response is stored, and from then on the
// replay and the status endpoint give it. Close stops the retrying; should
// the process stop before the response is stored, the key's lock goes stale
// and the next request with the key runs the handler again: that run is
// what the second guard below is for.
//
// For the same reason the handler's context is not canceled when the client
// disconnects: the work the client started finishes and is stored for its
// retry. It is canceled only when the key's lock can no longer be kept,
// with ErrLockNotRenewed as its cause (see below).
//
// # Policies
//
// Config.StorePolicy decides what becomes of a key whose handler failed.
// StoreAll (the default) stores every response the handler wrote, 5xx
// included, as Stripe does, and for a handler that panicked a 500 problem
// of type ProblemHandlerPanicked; the panic goes on. A retry gets the
// stored failure instead of running a handler that may have half acted: a
// failed handler is not run again for its key. SkipServerErrors releases
// the key after a 5xx or a panic, so that a retry with the key runs the
// handler again, at once: choose it only when every handler's failure
// undoes whatever it did (one transaction that rolls back), or that retry
// may act twice.
//
// Entries are kept for Config.Retention (24 h by default; counted from the
// claim while in progress, from the stored response once complete). An
// expired entry reads as absent at once, and the sweeper deletes it every
// SweepInterval: a request reusing the key after that is a new request.
// Publish the retention to clients: idem clients stop resending before it
// ends.
//
// # Stale locks and fencing
//
// While a handler runs, and until its response is stored, its lock is
// renewed every LockTimeout/3. A lock older than LockTimeout therefore
// means the process that held it died, or could not reach the store for
// that long. The next request with the same key and payload then takes the
// entry over with a new fencing token and runs the handler.
//
// A process cut off from its store cannot tell that its lock is going
// stale, so it acts first: when no renewal succeeded for 2/3 of
// LockTimeout, the handler's context is canceled with ErrLockNotRenewed as
// its cause (context.Cause), before anybody may take the key over. A
// handler that honours its context stops there. If it then fails (5xx or
// panic), the failure is the interruption's, not the request's: it is not
// stored, the client gets 409, and the lock, no longer renewed, goes
// stale, so that the next request with the key runs the handler again. An
// answer below 500 is stored as usual. Should the handler come back after
// a take-over, its token no longer holds the lock: its response is neither
// stored nor sent, and its client gets 409 and finds the taker's result.
//
// # The status endpoint
//
// StatusHandler answers GET …/{key} in the caller's scope with
// {"key","state"}: "processing" while a handler runs or its response waits
// to be stored, "completed" with the stored response (a stored failure
// included), and 404 "not_found" when there is no entry — never seen
// within the retention, swept, or released. An entry whose lock is stale
// also reads as not_found: its handler is dead, and a request sent now with
// the key will run it, which is exactly what not_found tells a client to
// do. A store failure is a 503, never not_found, so that a client never
// takes "could not look" for "never happened".
//
// # The second guard
//
// The middleware is one guard. A handler can still run twice for one key
// (see What runs once): after a take-over of a handler whose process died
// past its own commit, before the response was stored, or after the store
// lost a stored response. KeyFromContext gives the handler the key; store
// it in the application's own table under a UNIQUE (tenant, key)
// constraint, in the same transaction as the effect, and answer a
// constraint violation with the record that is already there, as
// examples/server/orders does.
//
// # Scope
//
// Config.Scope is required: it returns the tenant or credential the
// service's authentication established for the request. Keys are looked up
// per scope, so one tenant can neither replay nor query another's
// responses, and two tenants may use the same key independently. New
// refuses a Config without it, because a key space shared by every caller
// hands a stored response to anyone who can name its key (for a
// deterministic key, anyone who knows the scheme). An API with exactly one
// tenant passes SingleTenant, which says so in the code.
//
// Mount the status endpoint behind the same authentication as the routes
// it reports on, so that Scope reads the same tenant there: it answers
// only within the caller's scope, and another tenant's key reads as
// not_found, never with its response.
//
// # Stores
//
// Every Store passes package storetest, as any other must:
//
//   - NewMemoryStore keeps entries in memory, for tests and single
//     instances that may forget keys on restart.
//   - OpenSQLiteStore keeps them in an SQLite file shared by every process
//     on the machine, claims durable before the handler runs.
//   - postgres.OpenStore (module github.com/idemkit/idem/postgres) keeps
//     them in PostgreSQL, shared by every replica of an API, so that a
//     request retried on another replica finds its key.
//   - redis.Open (module github.com/idemkit/idem/redis) keeps them in
//     Redis, one server, Sentinel or Cluster, shared by the replicas of an
//     API that share no database.
//
// The suite holds a store to what these do: keep any scope, key and route
// byte for byte (a path that decodes to bytes that are not UTF-8 or to a
// NUL, a scope as long as a token). A store that cannot keep some request
// wraps ErrUnstorable, and the middleware answers it 400 with the store's
// reason: never 503, which would have the client send the same request
// again, forever. The middleware passes every time (Now, StaleBefore,
// ExpiresAt) as its process's clock reads it; a store that machines share
// judges them on its server's clock instead, moving each by the offset
// between the two, as the PostgreSQL store does, so that a replica whose
// clock is wrong neither takes a live handler's key nor expires a kept
// response.
package server
