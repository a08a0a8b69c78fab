package otel

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"syscall"

	"go.opentelemetry.io/otel/attribute"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
)

// Attribute keys. Where OpenTelemetry's semantic conventions name the
// thing, their name is used; idem's own are under "idem.". No attribute
// holds a body, a header value, a credential, a raw key, a URL path or
// query, or (unless WithOperationID) the operation's ID.
const (
	// Semantic conventions.
	keyMethod     = attribute.Key("http.request.method")
	keyStatusCode = attribute.Key("http.response.status_code")
	keyAddress    = attribute.Key("server.address")
	keyPort       = attribute.Key("server.port")
	keyErrorType  = attribute.Key("error.type")

	// The operation.
	keyScope       = attribute.Key("idem.operation.scope")
	keyOperationID = attribute.Key("idem.operation.id") // WithOperationID only
	keyKeyHash     = attribute.Key("idem.key.hash")
	keyCall        = attribute.Key("idem.call") // do, send, resume
	keyTakenFrom   = attribute.Key("idem.lease.taken_from")

	// A call's end.
	keyState        = attribute.Key("idem.state")
	keyAttempts     = attribute.Key("idem.attempts")
	keyStatusChecks = attribute.Key("idem.status_checks")
	keySettledBy    = attribute.Key("idem.settled_by")
	keyReplayed     = attribute.Key("idem.replayed")
	keyExpired      = attribute.Key("idem.expired")

	// An attempt.
	keyAttempt = attribute.Key("idem.attempt")
	keyVerdict = attribute.Key("idem.verdict")
	keyWritten = attribute.Key("idem.written")
	keyWaitMS  = attribute.Key("idem.wait_ms")

	// A status check.
	keyStatusCheck  = attribute.Key("idem.status_check")
	keyStatusState  = attribute.Key("idem.status.state")
	keyStoredStatus = attribute.Key("idem.status.stored_status_code")
	keyStatusReplay = attribute.Key("idem.status.replay")
	keyRetryAfterMS = attribute.Key("idem.status.retry_after_ms")

	// A journal commit.
	keyDurable = attribute.Key("idem.journal.durable")

	// What the server's middleware did.
	keyOutcome     = attribute.Key("idem.outcome")
	keyTookOver    = attribute.Key("idem.took_over")
	keyStoreFailed = attribute.Key("idem.store_failed")
)

// KeyHash returns what the attribute idem.key.hash holds for a key: the
// first 8 bytes of SHA-256(scope, 0x00, key), in hex. The client and the
// server hooks compute it alike, and the server middleware's logs show the
// same value as key_hash, so that a client's span, the server's span and
// the server's log lines of one operation can be found by it (when the
// client's scope and the server's agree), while the key itself, which a
// replay could use, never leaves the process.
func KeyHash(scope, key string) string { return wire.KeyHash(scope, key) }

// method returns the method as semantic conventions record it: a known
// method as is, any other as _OTHER (it could be anything the caller chose).
func method(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "_OTHER"
}

// hostPort returns the host and port of rawURL, never its path or query.
func hostPort(rawURL string) (host string, port int, ok bool) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return "", 0, false
	}
	host = u.Hostname()
	if p := u.Port(); p != "" {
		port, _ = strconv.Atoi(p)
	} else {
		switch u.Scheme {
		case "http":
			port = 80
		case "https":
			port = 443
		}
	}
	return host, port, true
}

var verdictNames = map[idem.Verdict]string{
	idem.Succeeded: "succeeded", idem.Rejected: "rejected", idem.KeyConflict: "key_conflict",
	idem.Retry: "retry", idem.RetrySameKey: "retry_same_key", idem.InProgress: "in_progress", idem.Unknown: "unknown",
}

func verdict(v idem.Verdict) string {
	if n, ok := verdictNames[v]; ok {
		return n
	}
	return "_OTHER"
}

// callErrors are the classes error.type takes on a call's span and
// metrics, tested with errors.Is in this order: an error of one class also
// matches those after it (ErrKeyConflict is an ErrRejected), so the more
// specific comes first, as in the package idem's table.
var callErrors = []struct {
	err  error
	name string
}{
	{idem.ErrInvalidOp, "idem.ErrInvalidOp"},
	{idem.ErrBodyTooLarge, "idem.ErrBodyTooLarge"},
	{idem.ErrClientClosed, "idem.ErrClientClosed"},
	{idem.ErrFingerprintMismatch, "idem.ErrFingerprintMismatch"},
	{idem.ErrKeyConflict, "idem.ErrKeyConflict"},
	{idem.ErrRejected, "idem.ErrRejected"},
	{idem.ErrKeyNotHonoured, "idem.ErrKeyNotHonoured"},
	{idem.ErrNeedsReconciliation, "idem.ErrNeedsReconciliation"},
	{idem.ErrCanceled, "idem.ErrCanceled"},
	{idem.ErrNotSent, "idem.ErrNotSent"},
	{idem.ErrOutcomeUnknown, "idem.ErrOutcomeUnknown"},
	{idem.ErrDiskFull, "idem.ErrDiskFull"},
	{idem.ErrJournalClosed, "idem.ErrJournalClosed"},
	{idem.ErrJournalCorrupt, "idem.ErrJournalCorrupt"},
	{context.Canceled, "context.Canceled"},
	{context.DeadlineExceeded, "context.DeadlineExceeded"},
}

// callErrorType names the class of a call's error; never its message,
// which may hold the URL.
func callErrorType(err error) string {
	for _, c := range callErrors {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	return "_OTHER"
}

// transportErrorType names the class of an attempt's or a status check's
// transport error, as error.type: never its message, which holds the URL.
func transportErrorType(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection_refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection_reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	case errors.Is(err, idem.ErrBadStatus):
		return "idem.ErrBadStatus"
	}
	return "_OTHER"
}
