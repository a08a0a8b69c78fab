//go:build !idem_ackearly

package sqlitefile

// ackEarly is false in every real build: a Durable write returns only once
// its transaction is on disk. See ackearly_on.go.
const ackEarly = false
