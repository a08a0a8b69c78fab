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
//	res, err := c.Do(ctx, idem.Op{ID: "checkout/cart-42", URL: "/orders", Body: body})
//
// err is nil exactly when the answer is definitive: res.State is
// StateSucceeded (2xx) or StateRejected (a definitive refusal), with the
// server's status, headers and body. Any other outcome is an
// *OperationError that says what is known, and the operation stays safely
// journaled: ErrOutcomeUnknown (it may have been applied; a status check
// will tell), ErrNotSent (it certainly was not applied), ErrNeedsReconciliation
// or ErrKeyConflict. Resume, run after a restart, finishes every operation
// left unfinished; with Config.ResumeInterval the client runs it in the
// background. Result.Journaled tells an answer an earlier call settled, for
// which nothing was sent, from one this call obtained.
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
// The journal holds the key, the scope and ID, the exact method, URL,
// headers and body, a fingerprint, the state, attempt counts, the lease, the
// server's response and an append-only history of every change. It never
// holds credentials: Authorization, Proxy-Authorization, Cookie and any
// header in Config.SecretHeaders are refused in Op.Header, Set-Cookie is
// dropped from stored responses, and Config.Authorize adds credentials to
// each attempt right before it is sent.
//
// An intent is durable before anything is sent: Do creates the record
// directly as in_flight, fsynced. A success is recorded Buffered: Do returns
// before it is committed, and the next journal write (usually the next
// operation's intent) commits it in the same transaction and fsync. If a
// crash loses it, the record reads in_flight, and the status check made on
// resume returns the same outcome. A rejection is fsynced before Do returns,
// since a server need not keep what it refused. So the happy path costs one
// fsync, shared with concurrent callers by the SQLite journal's group
// commit.
//
// # Retries and unknown outcomes
//
// Attempts go through go-retryablehttp with a classifier (Classify) that
// tells apart a request that was never written (dial refused: safe to send
// again), one that was written and got no answer (unknown: check status),
// and the server's answers: 2xx, 409 in progress, 422 key reused, 429/503
// with Retry-After, other 5xx. Backoff has jitter; a retry budget shared by
// the client keeps an outage from becoming a retry storm; no wait runs past
// the context's deadline.
//
// When the outcome is unknown the client asks its StatusChecker:
// StatusEndpoint for servers that expose GET {base}/{key} (package server
// serves one), or ReplayStatus for servers that replay stored answers when
// the same key is sent again, as Stripe does. A status call that fails or
// does not parse leaves the operation unknown: it is never read as "not
// found".
//
// A server that does not keep keys executes a replay again. When the client
// holds the beginning of a first answer (its body broke off) and the next
// answer for the same key differs, it stops: nothing more is sent, and the
// operation is parked for an operator with ErrKeyNotHonoured.
//
// # Concurrency and crashes
//
// Calls for one operation from many goroutines share one attempt on the
// wire and return the same result. Across processes sharing a journal, a
// lease (renewed while its holder lives, fenced by an epoch) keeps one
// worker driving each operation; another worker takes over when the holder's
// process dies. Resume claims due operations with such leases, only those
// whose URL has Config.BaseURL's origin (so that a client's credentials
// never go to another API), and only those due when it started (so that it
// makes one pass, even while a server keeps failing).
//
// # Server side
//
// Package server is the counterpart middleware: it honours keys (one
// execution per key, 409 while running, 422 on another payload, the stored
// response replayed byte for byte) and serves the status endpoint. The
// operator CLI in cmd/idem lists, inspects, resumes, reconciles and prunes a
// journal.
package idem
