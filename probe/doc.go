// Package probe finds out what an HTTP endpoint does with idempotency keys
// before idem is trusted with it: whether it replays a repeated key, which
// header and form it reads the key from, what it does with a key reused
// for another request or sent twice at once, and whether its status
// endpoint speaks idem's format. Run returns a Report: the findings with
// their evidence, a verdict, and the idem.Config fields to set. The idem
// command's "idem probe" is a thin layer over it; an application can run
// it in its own integration tests, against a staging API.
//
// # It sends real requests
//
// Every request is a real call to the endpoint, with its real effects:
// orders created, cards charged. Probe a test account or a staging
// environment. Run sends at most Config.MaxRequests (20 by default),
// counted as they reach the wire, each on a connection of its own so that
// net/http never sends one again by itself (see Config.HTTPClient),
// announces each step with the number of requests it sends
// (Config.OnStep), and skips a step that the budget cannot afford, saying
// so in its finding. Each step uses a fresh random key (a UUID), which
// holds nothing about anyone. Config.Header carries the credentials: they
// are sent with every request and never reported; the report names
// headers, never their values, and error messages blank them out.
//
// # The steps
//
//  1. replay: the same key twice. Replayed (a replay header, which
//     spelling; the same status and body), or executed twice: two 2xx
//     answers that differ, neither marked replayed. When the key is
//     ignored, the other common header names (Idempotency-Key,
//     X-Idempotency-Key) are tried, two requests each. When the first
//     request is refused with 400, 422 or 428, the key may be in a form
//     the endpoint does not read: it is sent again, once per form (the
//     sf-string, then the other header names), until one is accepted.
//     Any other refusal of the first request (401, 404, 5xx) ends Run with
//     an *AnswerError saying what to fix.
//  2. mismatch: one key with the body, then with another body
//     (Config.OtherBody, else derived from a JSON body). Refused as a key
//     conflict idem.Classify recognises, refused otherwise (417, say), or
//     silently replayed.
//  3. concurrent: two requests with one key at once. 409 while the first
//     runs (with Retry-After or not), both answered with one execution
//     (the server waited), or executed twice.
//  4. other-endpoint, when Config.OtherURL or OtherMethod is set: a used
//     key on another path or method. The same entry (refused, or this
//     endpoint's answer replayed) or a new one.
//  5. status, when Config.StatusURL is set: the status endpoint's answer
//     for a used key and for a never-used one, which must be 404, read
//     with idem's status format (idem.StatusEndpoint).
//  6. key-form: the key as a bare token and as an RFC 8941 sf-string.
//
// Once the replay step finds the key ignored under every header tried,
// the later steps are skipped: they would only repeat effects.
//
// # What it cannot tell
//
// The probe judges by answers. An endpoint whose every answer is the same
// (no ID, no timestamp) looks like one that replays; the finding says so
// when no replay header confirmed it. Two requests sent at once may not
// overlap at the server if the first finishes first; the concurrent
// finding gives both answers' timings. A step passing once is evidence,
// not proof: the server's own documentation and tests have the last word.
//
// # Verdicts
//
// A Report is NotSafe when a key ran twice or was ignored, Usable when
// idem works with the settings in Report.Advice (another KeyHeader,
// QuoteKey, a status adapter), and Safe otherwise. Findings graded "warn"
// are safe for idem, which never reuses a key for another request, but
// worth knowing. Skipped steps do not change the verdict; Report.Complete
// is false when any was skipped.
package probe
