// Package idem makes state-changing HTTP calls safe to retry, safe to crash
// in the middle of, and safe to resume.
//
// A POST that timed out may have created the order. Sending it again as a
// new request creates a second order; giving up loses track of the first.
// idem gives each logical operation one stable idempotency key, writes the
// key and the exact request to a local journal before the first byte is
// sent, reuses that key on every retry and every restart, and when the
// outcome is unknown asks the server what happened instead of sending a new
// request.
//
// # The model
//
// An operation is named by the caller: a scope (the tenant) and an ID such
// as "checkout/cart-42" or an agent's tool-call ID. The first Do (or Begin)
// for a (scope, ID) mints its key and journals it; every later call for the
// same (scope, ID), in this process or after a restart, finds the journaled
// key and never mints another. The same ID with a different request is
// refused with ErrFingerprintMismatch, and nothing is sent.
//
//	j, _ := idem.OpenSQLite("ops.db")
//	c, _ := idem.New(idem.Config{
//		Journal: j,
//		BaseURL: "https://api.example.com",
//		Status:  idem.StatusEndpoint("https://api.example.com/idempotency"),
//		Authorize: func(r *http.Request) error {
//			r.Header.Set("Authorization", "Bearer "+token())
//			return nil
//		},
//	})
//	defer c.Close()
//	res, err := c.Do(ctx, idem.Op{ID: "checkout/cart-42", URL: "/orders", Body: body})
//
// err is nil exactly when the operation succeeded: res is the server's 2xx
// answer. A definitive refusal is an error too (ErrRejected), with res
// holding the server's answer; every other outcome is an *OperationError
// that says what is known, and the operation stays safely journaled. The
// table below lists them all. Resume, run after a restart, finishes every
// operation left unfinished; with Config.ResumeInterval the client runs it
// in the background. Result.Journaled tells an answer an earlier call
// settled, for which nothing was sent, from one this call obtained.
//
// # Errors
//
// Test them in this order: an error of a row also matches the sentinels
// the row names in parentheses, so the more specific one comes first.
//
//	error                          *OperationError?        the operation          what to do
//	nil                            -                       succeeded              use res
//	ErrInvalidOp, ErrBodyTooLarge  no                      nothing journaled/sent fix the Op
//	ErrInvalidConfig               no (from New)           -                      fix the Config field it names
//	ErrClientClosed                no                      nothing journaled/sent the client was closed
//	ErrFingerprintMismatch         yes: the existing one   untouched, not sent    a new ID, or the same request
//	ErrKeyConflict (ErrRejected)   yes, status and body    rejected (settled)     the key holds another request
//	ErrRejected                    yes, status and body    rejected (settled)     never re-sent; fix, then a new ID
//	ErrKeyNotHonoured (ErrNeeds…)  yes                     expired                check for a duplicate, Reconcile
//	ErrNeedsReconciliation         yes                     expired                check the records, Reconcile
//	ErrCanceled                    yes                     canceled (settled)     it was withdrawn before sending
//	ErrNotSent                     yes                     pending: not applied   Resume or Do sends it; or Cancel
//	ErrOutcomeUnknown              yes                     unknown: maybe applied Resume or Do asks the server
//
// The *OperationError of the last two carries why, as its cause, matched
// with errors.Is: ErrBadStatus (a status answer of the wrong shape),
// ErrRetryBudgetExhausted (many operations fail at once), ErrLeaseLost
// (another worker took the operation over and drives it now),
// ErrAuthorizeFailed (Config.Authorize returned an error, which the error
// wraps too: nothing was sent, and no attempt is counted),
// context.DeadlineExceeded or context.Canceled (your context ended), or a
// journal error such as ErrDiskFull. A journal error before anything was
// sent (ErrDiskFull, ErrJournalClosed, ErrJournalCorrupt, a context error)
// comes bare: nothing was sent, retry the call once it is fixed.
//
// # States
//
//	pending ──send──▶ in_flight ──2xx──▶ succeeded
//	   │                 │  └──4xx──▶ rejected
//	   │                 └──timeout/reset after writing──▶ unknown ──status──▶ succeeded | rejected
//	   │                                                     │  └─not_found: resend, same key
//	   └──Cancel──▶ canceled                                  └──past retention──▶ expired ──Reconcile──▶ …
//
// pending means the server cannot have seen the request: it is safe to
// send. in_flight means an attempt is on the wire; found after a crash it
// means unknown. unknown means the request may have reached the server: only
// a status check (or a replay of the same key) moves it on, never a new
// key. succeeded, rejected and canceled are final. expired means the server's
// key retention passed before the outcome was confirmed: it is never re-sent
// automatically, and an operator settles it with Reconcile.
//
// # What is journaled, and when
//
// The journal holds the key and its wire form (header name, bare or
// quoted), the scope and ID, the exact method, URL, headers and body, a
// fingerprint, the state, attempt counts, the lease, the server's response
// and an append-only history: every decision with its reason (each
// attempt and why it was sent, each status check and its answer, each claim
// and from whom, each stop and when the operation is due again). Every
// later attempt, replay and status check uses the record's key form,
// whichever client, process or tool sends it. The journal never holds
// credentials: Authorization, Proxy-Authorization, Cookie, X-Api-Key,
// X-Auth-Token, Api-Key and any header in Config.SecretHeaders are refused
// in Op.Header, Set-Cookie and those secret headers are dropped from
// stored responses (whatever the case of their names: a status endpoint's
// JSON need not be canonical), and
// Config.Authorize adds credentials to each request right before it is
// sent (OperationFrom tells it which operation, so it can choose them per
// tenant).
//
// An intent is durable before anything is sent: Do creates the record
// directly as in_flight, fsynced. A success is committed before Do
// returns, without waiting for an fsync of its own (Deferred): the next
// durable write (usually the next operation's intent) carries it to disk.
// A rejection is fsynced before Do returns, since a server need not keep
// what it refused. So the happy path costs one fsync, shared with
// concurrent callers by the SQLite journal's group commit.
//
// A crash of the process loses nothing Do returned. A power cut can lose
// only successes committed since the last fsync: such a record reads
// in_flight again, and Resume asks the server, which answers with the
// same result as long as it keeps the key (Config.Retention). Close and
// Shutdown make every write durable (Journal.Sync). An intent is never
// lost.
//
// # Retries and unknown outcomes
//
// Attempts go through go-retryablehttp with a classifier (Classify) that
// tells apart a request that was never written (dial refused: safe to send
// again), one that was written and got no answer (unknown: check status),
// and the server's answers: 2xx, a replayed answer (definitive), 409 in
// progress, a key conflict in one of the forms servers document, 429/503
// with Retry-After, other 5xx. Backoff has jitter; a retry budget shared by
// the client keeps an outage from becoming a retry storm. A server's
// Retry-After is never cut short: a call waits for it within its budget,
// RetryPolicy.MaxRetryAfter and its context's deadline, and otherwise
// returns with the operation due again at the server's time.
//
// When the outcome is unknown the client asks its StatusChecker:
// StatusEndpoint for servers that expose GET {base}/{key} (package server
// serves one), StatusAdapter for a status endpoint of another shape, or
// ReplayStatus for servers that replay stored answers when the same key is
// sent again, as Stripe does (each replay is an attempt: journaled first,
// fenced by the lease, counted). A status call that fails or does not
// parse leaves the operation unknown: it is never read as "not found", and
// the error says why (ErrBadStatus, naming the checker).
//
// A server that says it is still processing the key (a 409 in progress,
// a status answering "processing") is waited for: by Do and Send until
// their context's deadline when it has one, else for at most
// RetryPolicy.MaxStatusChecks checks within RetryPolicy.Budget; each
// operation of Resume gets the count. The error names the bound that ended
// the wait (context.DeadlineExceeded, or the RetryPolicy field), and the
// operation stays unknown for Resume. After a server crash, a key whose
// request was running keeps its lock until the server's lock timeout
// lapses (one minute by default for package server's LockTimeout), and
// reads "processing" all that time: give Do a deadline past it to wait it
// out, or let Resume finish the operation later.
//
// A server that does not keep keys executes a replay again. When the client
// holds the beginning of a first answer (its body broke off) and the next
// answer for the same key differs, it stops: nothing more is sent, and the
// operation is parked for an operator with ErrKeyNotHonoured. So it is
// when the client holds the beginning of a success and the status check
// then says the server never saw the key: the server lost it, and a
// re-send would be executed again. The journal keeps that success's status
// with the operation (in its LastError), so a later Do, Send or Resume, in
// this process or another, parks it on not_found too; and a parked
// operation matches ErrKeyNotHonoured on every later call.
//
// # Tenants, concurrency and crashes
//
// A client acts for one tenant (Config.Scope) with its credentials, and its
// Resume takes up only that tenant's operations (Config.ResumeScopes),
// addressed to BaseURL's origin: a tenant's credentials never go with
// another tenant's operations, nor to another API. An operator's tool
// widens that explicitly (ResumeAllScopes, ResumeAnyOrigin).
//
// Calls for one operation from many goroutines share one attempt on the
// wire and return the same result. Across processes sharing a journal, a
// lease, renewed while its holder lives and fenced by an epoch, keeps one
// worker driving each operation. Each client is a new lease owner (its
// name gets a unique suffix), registered with the journal: the SQLite
// journal sees a process die (its lock on a file beside the journal is
// dropped by the kernel) and lets another take its operations at once; a
// journal that cannot see that lets them be taken when the lease lapses.
// Resume claims only operations due when it started (one pass, even while a
// server keeps failing), or waits for the rest with ResumeWait, and reports
// what it left alone and why.
//
// # Watching it
//
// Config.Hooks follow every call (Do, Send, and each operation Resume
// drives), attempt and status check, with what tracing and metrics need
// and nothing a trace must not hold: no body, no header value, no
// credential. Hooks.Propagate adds the trace context to each request on
// the wire only (it is neither journaled nor fingerprinted), and
// Hooks.Link journals a link to the trace that created an operation, so
// that the spans of a Resume after a crash relate to it. SQLiteOnCommit
// reports each journal commit, and server.Config.OnOutcome what the
// middleware did with each request. The module github.com/idemkit/idem/otel
// implements all of them with OpenTelemetry; a client without hooks pays a
// nil check for each. OnTransition reports each journaled state change.
//
// # With the client you already have
//
// A vendor SDK or a generated OpenAPI client takes an *http.Client or an
// http.RoundTripper: give it Client.StandardClient (or Client.RoundTripper),
// and name the operation in the context of the call with WithOperation
// (WithScopedOperation for another tenant's). The request is then that
// operation, journaled, keyed, settled and resumed as Do's. A definitive
// answer (2xx, a rejection, a replay) is an *http.Response, and ResultOf
// gives its Result; anything else is an error that errors.Is matches with
// the sentinels above through the *url.Error of net/http. The request's
// credentials go with this call only, never to the journal (Resume uses
// Config.Authorize); a key the SDK sets itself is replaced by the
// operation's journaled key, so that one operation has one key across the
// SDK's calls and restarts. A request whose context names no operation
// passes through untouched (RefuseUnnamedWrites refuses writes instead).
//
// # Server side
//
// Package server is the counterpart middleware: it honours keys (one
// execution per key, 409 while running, 422 on another payload, the stored
// response replayed byte for byte) and serves the status endpoint. The
// operator CLI in cmd/idem lists, inspects, resumes, reconciles and prunes a
// journal.
package idem
