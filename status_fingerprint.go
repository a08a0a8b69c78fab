package idem

import (
	"fmt"
	"net/url"

	"github.com/idemkit/idem/internal/wire"
)

// maxStrippedSegments bounds the path prefixes sameRequest tries as
// stripped by a proxy: each try hashes the body again, and a gateway
// strips a few segments (/api, /v1/orders-service), not dozens.
const maxStrippedSegments = 8

// sameRequest reports whether fp, a status answer's fingerprint of the
// request the server stored the key for (wire.RequestFingerprint: method,
// target, body), is that of rec's request.
//
// The server fingerprints the target it received; the client has the one
// it sent. They are the same unless something between rewrote it. The one
// rewrite common enough to expect is a reverse proxy (or http.StripPrefix)
// in front of the server that strips a path prefix: the client sent
// /api/orders, the server saw /orders (or orders). So the journaled target
// is tried as it is, then with up to maxStrippedSegments leading segments
// stripped, with and without the slash after them; the method, the rest of
// the path, the query and the body must be the same. Any other rewrite (a
// prefix added, a path renamed, a query Authorize adds a fresh token to)
// makes every try differ: the caller then keeps the operation unknown
// (never rejected), so a genuine completion that cannot be recognised is
// left for an operator, never reported as not applied.
func sameRequest(fp string, rec Record) bool {
	u, err := url.Parse(rec.URL)
	if err != nil {
		return false
	}
	path := u.EscapedPath()
	if path == "" {
		path = "/" // what a request line carries for an empty path
	}
	query := ""
	if u.RawQuery != "" {
		query = "?" + u.RawQuery
	}
	if wire.RequestFingerprint(rec.Method, path+query, rec.Body) == fp {
		return true
	}
	stripped := 0
	for i := 1; i < len(path) && stripped < maxStrippedSegments; i++ {
		if path[i] != '/' {
			continue
		}
		stripped++
		if wire.RequestFingerprint(rec.Method, path[i:]+query, rec.Body) == fp ||
			wire.RequestFingerprint(rec.Method, path[i+1:]+query, rec.Body) == fp {
			return true
		}
	}
	return false
}

// otherRequestCause is why an operation stays unknown when the status
// answer is about another request under its key.
func (d *driver) otherRequestCause(st Status) error {
	stored := ""
	if st.Response != nil {
		stored = fmt.Sprintf(", whose stored answer is HTTP %d", st.Response.StatusCode)
	}
	return fmt.Errorf("status check %d by %s: %w: key %s is held for a request with fingerprint %.12s…%s, not for %s %s with this operation's body (nor that target with a path prefix a proxy strips), so its answer is not taken as this operation's. Either the key was reused (by another client, an operator's replay, a chosen ID reused) and this operation was refused, or the server holds an earlier attempt of it in a form the client cannot reproduce (a URL that Authorize or a proxy rewrites). Nothing is sent again: check the business records, then settle it with Reconcile (or it expires with the server's retention)",
		d.checks, d.c.statusName, ErrKeyHeldForAnotherRequest, d.rec.Key, st.Fingerprint, stored, d.rec.Method, redactString(d.rec.URL))
}
