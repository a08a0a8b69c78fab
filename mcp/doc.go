// Package mcp makes the tool calls of an agent runtime exactly-once over
// the Model Context Protocol, on both sides of it, with the official Go
// SDK (github.com/modelcontextprotocol/go-sdk). Import it under another
// name than go-sdk's package, such as idemmcp.
//
// MCP has no idempotency mechanism: a client whose tools/call lost its
// answer (a dropped connection, a timeout, a crash) cannot tell "never
// arrived" from "ran, answer lost". This package adds one, as a convention
// on the request's _meta:
//
//   - The client sends the call's idempotency key in _meta[MetaKey]
//     ("io.github.idemkit/idempotency-key"), one key per logical tool
//     call, the same on every retry. On streamable HTTP, protocol
//     2025-06-18 and later (which has no JSON-RPC batches), it may come in
//     the Idempotency-Key header instead.
//   - The server runs the tool once per key and caller, stores its result
//     (an isError result and a JSON-RPC error too), and answers a
//     repeated key with the stored result, marked _meta[MetaReplayed]
//     ("io.github.idemkit/replayed") = true. The same key with other
//     arguments, by their canonical JSON (Canonical), is CodeKeyReused.
//     The mark is the server's key handling's: a Guard drops one a tool
//     sets itself.
//   - A tool that panics in a call's first round may have acted before
//     it failed: the failure is stored as the key's outcome (a JSON-RPC
//     internal error, replayed to every retry), and the panic goes on as
//     a *PanicError that keeps the value and the tool's stack.
//   - A tool that asks for input first (an input-required result,
//     multi-round-trip) has not done its work: the rounds that bring the
//     input run it, and the first of them that ends the call is replayed
//     to every later one, however the input is answered.
//
// On the server side, a Guard does that for a go-sdk server, as receiving
// middleware, on any server.Store (memory, SQLite, PostgreSQL, Redis).
// Keys are kept per caller (GuardConfig.Scope: the authenticated user of
// the bearer token by default, a constant on stdio), so one caller's key
// never reaches another's result. Its errors are JSON-RPC errors with the
// codes CodeKeyReused, CodeInProgress, CodeKeyRequired, CodeKeyInvalid,
// CodeStoreUnavailable and CodeNoCaller, whose data holds "key" and, where
// a retry can succeed, "retryAfterMs".
//
// On the client side, a Caller makes each tool call an idem operation,
// named by the runtime's own tool-call ID: journaled with its tool, its
// arguments as the runtime wrote them and a key before it is sent; a lost answer is
// settled by sending the call again with its key; after a crash, Resume
// finishes what was pending, through a session from CallerConfig.Open.
// Its journal scope (CallerConfig.Scope, required) names whose
// credentials Open connects with: Callers of other identities on one
// journal never share a call, nor Resume one another's. In
// the journal, and so in `idem ls` and `idem ui`, a call appears as
// POST http://{server}.mcp.invalid/tools/{tool}, an address that never
// resolves.
//
// The Caller's promise rests on the server: one that does not honour keys
// runs a re-sent call again. Verify tells, with two calls under one key to
// a tool the operator marks as safe to test, the second on a new session.
package mcp
