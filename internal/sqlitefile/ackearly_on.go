//go:build idem_ackearly

package sqlitefile

// ackEarly, set by the build tag idem_ackearly, breaks the durability
// promise on purpose: a Durable write returns once committed, before its
// fsync (as Deferred does), so that an intent is acknowledged, and its
// request sent, while a power cut can still take it back. It exists only
// for the power-cut tests (powercut/), which build their client with it to
// show that they catch exactly this; no real build sets the tag.
const ackEarly = true
